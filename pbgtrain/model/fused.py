"""The step's memory-bound passes, eager (the reference) or fused by ``torch.compile``.

The score matrices of a step are large ([batch, negatives] per side) and the work on them after
the matrix products is elementwise: the softmax loss's row max, ``exp``, row sums and, in the
backward, the scaling of the saved ``exp``; and the count of violators. Eagerly each is a pass
over memory; compiled (``--compile``: Triton kernels on a GPU, C++/OpenMP on a CPU) they fuse into
a few. The eager functions (:func:`~pbgtrain.model.losses.softmax_forward`,
:func:`~pbgtrain.model.losses.softmax_backward`, :func:`~pbgtrain.model.step.violators`) are the
reference: the compiled ones are the same functions handed to ``torch.compile``, and a test checks
they agree. Compiling costs tens of seconds once per process (shapes are compiled as dynamic).

>>> kernels().name
'eager'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kernels:
    name: str
    softmax_forward: Callable[..., Any]
    softmax_backward: Callable[..., Any]
    violators: Callable[..., Any]


def _eager() -> Kernels:
    from pbgtrain.model.losses import softmax_backward, softmax_forward
    from pbgtrain.model.step import violators

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
    import torch

    def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(fn, dynamic=True)

    _active = Kernels("compiled", compiled(eager.softmax_forward), compiled(eager.softmax_backward),
                      compiled(eager.violators))
    return _active
