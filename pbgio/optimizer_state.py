"""The ``optimizer/state_dict`` blob of checkpoint files: encode and decode.

The original stores ``torch.save(optimizer.state_dict())`` bytes in a 1-D ``|V1``
dataset. Embeddings files hold the RowAdagrad state of one partition
(``{"state": {0: {"sum": Tensor[N]}}, "param_groups": [{"lr": ..., "params": [0]}]}``);
the model file holds the Adagrad state of the relation parameters.

Decoding never runs pickled code: it uses torch's restricted ``weights_only`` loader,
and a blob it refuses becomes a :class:`~pbgio.errors.FormatError` naming the file.
Importing this module does not import torch; the functions do.

>>> import numpy as np
>>> blob = encode_row_adagrad(np.array([0.5, 2.0], np.float32), lr=0.1)
>>> decode_row_adagrad(blob, "embeddings_user_0.v1.h5")
array([0.5, 2. ], dtype=float32)
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pbgio.errors import FormatError
from pbgio.spec.rules import rule


def encode_state_dict(state: Mapping[str, Any]) -> bytes:
    """``torch.save`` bytes of an optimizer state dict (tensors moved to the CPU)."""
    import torch

    buffer = io.BytesIO()
    torch.save(_to_cpu(state), buffer)
    return buffer.getvalue()


def decode_state_dict(blob: bytes, source: str) -> dict[str, Any]:
    """An optimizer state dict from a blob, loaded without executing code."""
    import torch

    try:
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for refused or corrupt payloads
        raise FormatError(rule("optimizer-blob").issue(
            source, "optimizer/state_dict", f"expected a torch optimizer state dict, found an unreadable "
            f"payload ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")) from None
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict) \
            or not isinstance(state.get("param_groups"), list):
        raise FormatError(rule("optimizer-blob").issue(
            source, "optimizer/state_dict",
            f"expected {{'state': ..., 'param_groups': [...]}}, found {type(state).__name__}"))
    return state


def encode_row_adagrad(sums: NDArray[np.float32], *, lr: float) -> bytes:
    """The RowAdagrad state of one partition: one accumulator per embedding row."""
    import torch

    return encode_state_dict({"state": {0: {"sum": torch.from_numpy(np.ascontiguousarray(sums, np.float32))}},
                              "param_groups": [{"lr": lr, "params": [0]}]})


def decode_row_adagrad(blob: bytes, source: str) -> NDArray[np.float32] | None:
    """The per-row accumulators of a RowAdagrad blob; None when the optimizer has no state yet."""
    state = decode_state_dict(blob, source)
    entry = state["state"].get(0)
    if entry is None:
        return None
    sums = entry.get("sum") if isinstance(entry, dict) else None
    if sums is None or not hasattr(sums, "numpy"):
        raise FormatError(rule("optimizer-blob").issue(
            source, "optimizer/state_dict", "expected RowAdagrad state {'sum': Tensor[rows]}, found "
            f"keys {sorted(entry) if isinstance(entry, dict) else type(entry).__name__}"))
    return np.ascontiguousarray(sums.detach().float().reshape(-1).numpy())


def _to_cpu(value: Any) -> Any:
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu()
    if isinstance(value, Mapping):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    return value
