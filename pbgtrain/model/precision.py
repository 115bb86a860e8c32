"""Arithmetic precision of the score matrix products: fp32 (the reference), tf32 or bf16.

Whatever the precision, embeddings, gradients and the Adagrad state stay in float32 (the master
copy): tf32 lets CUDA's tensor cores round the matrix products' inputs to 10-bit mantissas, and
bf16 runs the products under ``torch.autocast``: bfloat16 inputs, float32 accumulation inside
each product, and the product's result rounded to bfloat16 (``tests/test_precision_statements.py``);
the step widens each result to float32 at once (:func:`full_precision`), so losses, gradients
past the products and everything elementwise are computed in float32. The original's ``half_precision: true``
selects bf16. tf32 exists on CUDA only; on a CPU it is the same as fp32.

>>> with precision_scope("bf16", torch.device("cpu")):
...     torch.matmul(torch.ones(2, 3), torch.ones(3, 2)).dtype
torch.bfloat16
>>> full_precision(torch.ones(2, dtype=torch.bfloat16)).dtype
torch.float32
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from pbgtrain.choices import PRECISIONS, Precision

__all__ = ["PRECISIONS", "Precision", "check_precision", "full_precision", "precision_scope"]

_LOW = (torch.bfloat16, torch.float16)


def check_precision(name: str) -> Precision:
    """``name`` if it is a precision, else a ValueError listing them."""
    for p in PRECISIONS:
        if name == p:
            return p
    raise ValueError(f"unknown precision {name!r}; expected one of {list(PRECISIONS)}")


@contextlib.contextmanager
def precision_scope(precision: Precision, device: torch.device) -> Iterator[None]:
    """Run the enclosed steps at ``precision`` on ``device`` (settings restored on exit)."""
    if precision == "bf16":
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield
    elif precision == "tf32" and device.type == "cuda":
        matmul = torch.backends.cuda.matmul
        # torch >= 2.9 has fp32_precision ("ieee"/"tf32"); mixing it with the older allow_tf32 is refused
        key, value = ("fp32_precision", "tf32") if hasattr(matmul, "fp32_precision") else ("allow_tf32", True)
        saved = getattr(matmul, key)
        setattr(matmul, key, value)
        try:
            yield
        finally:
            setattr(matmul, key, saved)
    else:
        yield


def full_precision(x: Tensor) -> Tensor:
    """``x`` as float32 when autocast made it bfloat16/float16, else unchanged."""
    return x.float() if x.dtype in _LOW else x


def autocast_state(x: Tensor) -> torch.dtype | None:
    """The autocast dtype in force for ``x``'s device (None when autocast is off), to re-enter in
    a custom backward; the meta device, which only propagates shapes, has no autocast)."""
    kind = x.device.type
    if kind == "meta":
        return None
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
