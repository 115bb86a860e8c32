"""The step's memory-bound passes, eager (the reference) or fused by ``torch.compile``.

The score matrices of a step are large ([batch, negatives] per side) and the work on them after
the matrix products is elementwise: the softmax loss's row max, ``exp``, row sums and, in the
backward, the scaling of the saved ``exp``; and the count of violators. Eagerly each is a pass
over memory; compiled (``--compile``: Triton kernels on a GPU, C++/OpenMP on a CPU) they fuse into
a few. The eager functions here (:func:`softmax_forward`, :func:`softmax_backward`,
:func:`violators`) are the reference (:data:`EAGER`): the compiled ones (:func:`compiled_kernels`)
are the same functions handed to ``torch.compile``, and a test checks they agree. Compiling costs
tens of seconds once per process (shapes are compiled as dynamic). A step's head holds the kernels
it runs (:class:`~pbgtrain.model.negative_scores.ScoreMatrixHead`); nothing is switched process-wide.

>>> EAGER.name
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
    logsumexp(blocks) − pos (the eager reference of the fused kernel, :mod:`pbgtrain.model.score_kernels`)."""
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


def violators(pos: Tensor, blocks: list[Tensor], live: Tensor | None = None) -> Tensor:
    """How many negative scores exceed their positive, per leading row: pos [S, B], blocks [S, B, K]
    → [S] (left on the device); ``live`` [B] (bool): the rows that count (None: all)."""
    threshold = pos.unsqueeze(-1)
    if not blocks:
        return pos.new_zeros(pos.shape[:-1], dtype=torch.long)
    dims = (-2, -1) if live is None else (-1,)
    counts = (blocks[0] > threshold).sum(dims)  # a bool sum counts in int64 (count_nonzero copies first)
    for b in blocks[1:]:
        counts += (b > threshold).sum(dims)
    return counts if live is None else counts.mul_(live).sum(-1)


EAGER = Kernels("eager", softmax_forward, softmax_backward, violators)
"""The eager passes: the reference."""

_compiled: Kernels | None = None


def compiled_kernels() -> Kernels:
    """The same passes handed to ``torch.compile`` (dynamic shapes), made once per process."""
    global _compiled
    if _compiled is None:
        def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
            return torch.compile(fn, dynamic=True)

        _compiled = Kernels("compiled", compiled(softmax_forward), compiled(softmax_backward), compiled(violators))
    return _compiled
