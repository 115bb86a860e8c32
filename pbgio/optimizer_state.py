"""The ``optimizer/state_dict`` blob of checkpoint files: encode and decode.

The original stores ``torch.save(optimizer.state_dict())`` bytes in a 1-D ``|V1`` dataset:
embeddings files hold the RowAdagrad state of one partition, the model file the Adagrad
state of the model parameters; :mod:`pbgio.spec.optimizer` declares what each must hold for
the original to resume from it. Encoding uses ``torch.save`` (imported only then); decoding
and checking use :mod:`pbgio.formats.torch_payload`, which needs no torch and never runs pickled code.
A blob that breaks a rule (:mod:`pbgio.checks.optimizer` decides) becomes a
:class:`~pbgio.errors.FormatError` naming the file.

>>> import numpy as np
>>> blob = encode_row_adagrad(np.array([0.5, 2.0], np.float32), lr=0.1)
>>> decode_row_adagrad(blob, "embeddings_user_0.v1.h5", count=2)
array([0.5, 2. ], dtype=float32)
>>> state = read_state(blob, "embeddings_user_0.v1.h5")
>>> state.value["param_groups"]
[{'lr': 0.1, 'lr_decay': 0, 'weight_decay': 0, 'params': [0]}]
>>> checks.row_adagrad_problems(state.value, count=3)
["expected state[0]['sum'] of shape (3,) (one accumulator per embedding row), found (2,)"]
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

from pbgio.checks import optimizer as checks
from pbgio.checks import raise_first
from pbgio.errors import FormatError
from pbgio.formats.torch_payload import PayloadError, TorchPayload, read_payload
from pbgio.spec.optimizer import ADAGRAD, ROW_ADAGRAD, TensorRef

Shape = tuple[int, ...]


# --------------------------------------------------------------------------- encoding


def encode_state_dict(state: Mapping[str, Any]) -> bytes:
    """``torch.save`` bytes of an optimizer state dict (tensors moved to the CPU)."""
    import torch

    buffer = io.BytesIO()
    torch.save(_to_cpu(state), buffer)
    return buffer.getvalue()


def encode_row_adagrad(sums: NDArray[np.float32], *, lr: float) -> bytes:
    """The RowAdagrad state of one partition, with every group key the original reads."""
    import torch

    group = {key.name: (lr if key.name == "lr" else 0) for key in ROW_ADAGRAD.group_keys}
    return encode_state_dict({"state": {0: {"sum": torch.from_numpy(np.ascontiguousarray(sums, np.float32))}},
                              "param_groups": [{**group, "params": [0]}]})


def encode_adagrad(sums: Sequence[NDArray[np.float32]], *, lr: float, steps: float = 0.0) -> bytes:
    """An Adagrad state (the model file's) for parameters with these accumulators, given in the
    original's parameter order; every group key the original reads gets pbgtrain's value."""
    import torch

    written = {"lr": lr, "lr_decay": 0, "weight_decay": 0, "eps": 1e-10}
    group = {key.name: written[key.name] for key in ADAGRAD.group_keys}
    state = {i: {"step": torch.tensor(float(steps)), "sum": torch.from_numpy(np.ascontiguousarray(s, np.float32))}
             for i, s in enumerate(sums)}
    return encode_state_dict({"state": state, "param_groups": [{**group, "params": list(range(len(sums)))}]})


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


# --------------------------------------------------------------------------- reading


@dataclass
class OptimizerState:
    """A decoded blob: the state dict with :class:`~pbgio.formats.torch_payload.TensorRef` leaves."""

    payload: TorchPayload
    source: str

    @property
    def value(self) -> Any:
        return self.payload.value

    def array(self, ref: TensorRef) -> NDArray[Any]:
        try:
            return self.payload.array(ref)
        except PayloadError as exc:
            raise _blob_error(self.source, str(exc)) from None

    def blocks(self, ref: TensorRef) -> Iterator[NDArray[Any]]:
        try:
            yield from self.payload.blocks(ref)
        except PayloadError as exc:
            raise _blob_error(self.source, str(exc)) from None


def read_state(blob: bytes | IO[bytes], source: str) -> OptimizerState:
    """Unpickle a blob without torch; an unreadable or disallowed payload is ``optimizer-blob``."""
    try:
        return OptimizerState(read_payload(blob), source)
    except PayloadError as exc:
        raise FormatError(checks.payload_issue(source, str(exc))) from None


def _blob_error(source: str, message: str) -> FormatError:
    return FormatError(checks.blob_issue(source, message))


# --------------------------------------------------------------------------- what readers use


def decode_row_adagrad(blob: bytes | IO[bytes], source: str, *, count: int | None = None) -> NDArray[np.float32]:
    """The per-row accumulators of an embeddings file's blob (float32, one per row)."""
    state = read_state(blob, source)
    raise_first([checks.state_issue(source, checks.row_adagrad_problems(state.value, count), model=False)])
    sums = state.array(state.value["state"][0]["sum"])
    return np.ascontiguousarray(sums, dtype=np.float32)


def decode_adagrad(blob: bytes | IO[bytes], source: str, shapes: Sequence[Shape]) -> dict[str, Any] | None:
    """A model file's Adagrad state with numpy arrays for tensors (None for the empty state ``{}``).

    ``shapes`` are the model's parameter shapes in the original's parameter order.
    """
    state = read_state(blob, source)
    raise_first([checks.state_issue(source, checks.adagrad_problems(state.value, shapes), model=True)])
    if not state.value:
        return None
    materialized: dict[str, Any] = _materialize(state, state.value)
    return materialized


def _materialize(state: OptimizerState, value: Any) -> Any:
    if isinstance(value, TensorRef):
        return state.array(value)
    if isinstance(value, dict):
        return {k: _materialize(state, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_materialize(state, v) for v in value]
    return value
