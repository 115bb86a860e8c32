"""Numbers as operands: 0-dim tensors made once.

A Python number given to a tensor operation is turned into a tensor on every call (on a CPU, a
copy and four more dispatched operations); a 0-dim tensor of the other operand's dtype and
device is taken as it is. The small steps of training (row Adagrad, the relation optimizer)
use :func:`constant` for theirs.

>>> x = torch.ones(2)
>>> x.add_(constant(0.5, x)).tolist()
[1.5, 1.5]
>>> constant(0.5, x) is constant(0.5, x)
True
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


@functools.cache  # never evicted: a step replayed as a CUDA graph reads the tensor it captured
def _constant(value: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.tensor(value, dtype=dtype, device=device)


def constant(value: float, like: Tensor) -> Tensor:
    """``value`` as a 0-dim tensor of ``like``'s dtype and device, made once (never written to)."""
    return _constant(float(value), like.dtype, like.device)
