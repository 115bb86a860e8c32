"""The step's memory-bound passes, eager (the reference) or fused by ``torch.compile``.

The score matrices of a step are large ([batch, negatives] per side) and the work on them after
the matrix products is elementwise: the softmax loss's row max, ``exp``, row sums and, in the
backward, the scaling of the saved ``exp``; and the count of violators. Eagerly each is a pass
over memory; compiled (``--compile``: Triton kernels on a GPU, C++/OpenMP on a CPU) they fuse into
a few. The eager functions here (:func:`softmax_forward`, :func:`softmax_backward`,
:func:`violators`) are the reference: the compiled ones are the same functions handed to
``torch.compile``, and a test checks they agree. Compiling costs tens of seconds once per process
(shapes are compiled as dynamic).

>>> kernels().name
'eager'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class Kernels:
    name: str
    softmax_forward: Callable[..., Any]
    softmax_backward: Callable[..., Any]
    violators: Callable[..., Any]


def softmax_forward(pos: Tensor, blocks: list[Tensor]) -> tuple[Tensor, Tensor, list[Tensor]]:
    """``(gap, total, exps)``: exps = exp(block − rowmax), total their row sums, gap =
    logsumexp(blocks) − pos (the eager reference of the fused kernel, :mod:`pbgtrain.model.fused`)."""
    top = blocks[0].amax(-1)
    for b in blocks[1:]:
        top = torch.maximum(top, b.amax(-1))
    exps = []
    total: Tensor | None = None
    for b in blocks:
        e = b.sub(top.unsqueeze(-1)).exp_()
        total = e.sum(-1) if total is None else total.add_(e.sum(-1))
        exps.append(e)
    assert total is not None
    return (top - pos) + total.log(), total, exps


def softmax_backward(gap: Tensor, total: Tensor, exps: list[Tensor],
                     grad: Tensor | None) -> tuple[Tensor, list[Tensor]]:
    """The gradients of softplus(gap) (times ``grad``, None for 1) for pos and each block (the
    exps scaled in place)."""
    sig = torch.sigmoid(gap) if grad is None else torch.sigmoid(gap).mul_(grad)
    coef = (sig / total).unsqueeze(-1)
    return sig.neg_(), [e.mul_(coef) for e in exps]


def violators(pos: Tensor, blocks: list[Tensor]) -> Tensor:
    """How many negative scores exceed their positive, per leading row: pos [S, B], blocks [S, B, K]
    → [S] (left on the device)."""
    threshold = pos.unsqueeze(-1)
    dims = (-2, -1)
    if not blocks:
        return pos.new_zeros(pos.shape[:-1], dtype=torch.long)
    counts = (blocks[0] > threshold).sum(dims)  # a bool sum counts in int64 (count_nonzero copies first)
    for b in blocks[1:]:
        counts += (b > threshold).sum(dims)
    return counts


def _eager() -> Kernels:
    return Kernels("eager", softmax_forward, softmax_backward, violators)


_active: Kernels | None = None


def kernels() -> Kernels:
    """The kernels in use (eager unless :func:`use_compiled` turned compilation on)."""
    global _active
    if _active is None:
        _active = _eager()
    return _active


def use_compiled(enabled: bool = True) -> Kernels:
    """Compile the step's elementwise passes with ``torch.compile`` (``enabled=False``: back to eager)."""
    global _active
    eager = _eager()
    if not enabled:
        _active = eager
        return eager

    def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(fn, dynamic=True)

    _active = Kernels("compiled", compiled(eager.softmax_forward), compiled(eager.softmax_backward),
                      compiled(eager.violators))
    return _active
