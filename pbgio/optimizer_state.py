"""The ``optimizer/state_dict`` blob of checkpoint files: encode, decode and check.

The original stores ``torch.save(optimizer.state_dict())`` bytes in a 1-D ``|V1`` dataset:
embeddings files hold the RowAdagrad state of one partition, the model file the Adagrad
state of the model parameters; :mod:`pbgio.spec.optimizer` declares what each must hold for
the original to resume from it. Encoding uses ``torch.save`` (imported only then); decoding
and checking use :mod:`pbgio.formats.torch_payload`, which needs no torch and never runs pickled code.
A blob that breaks a rule becomes a :class:`~pbgio.errors.FormatError` naming the file.

>>> import numpy as np
>>> blob = encode_row_adagrad(np.array([0.5, 2.0], np.float32), lr=0.1)
>>> decode_row_adagrad(blob, "embeddings_user_0.v1.h5", count=2)
array([0.5, 2. ], dtype=float32)
>>> state = read_state(blob, "embeddings_user_0.v1.h5")
>>> state.value["param_groups"]
[{'lr': 0.1, 'lr_decay': 0, 'weight_decay': 0, 'params': [0]}]
>>> row_adagrad_problems(state, count=3)
["expected state[0]['sum'] of shape (3,) (one accumulator per embedding row), found (2,)"]
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

from pbgio.errors import FormatError
from pbgio.formats.torch_payload import PayloadError, TensorRef, TorchPayload, read_payload
from pbgio.spec.checkpoint import OPTIMIZER_DATASET
from pbgio.spec.optimizer import ACCUMULATOR_DTYPE, ADAGRAD, ROW_ADAGRAD, OptimizerSpec
from pbgio.spec.rules import rule

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
        raise _blob_error(source, f"expected a torch.save payload that torch.load(weights_only=True) "
                                  f"loads, found one where {exc}") from None


def _blob_error(source: str, message: str) -> FormatError:
    return FormatError(rule("optimizer-blob").issue(source, OPTIMIZER_DATASET, message))


# --------------------------------------------------------------------------- the rules


def row_adagrad_problems(state: OptimizerState, count: int | None) -> list[str]:
    """Why an embeddings file's state is not the RowAdagrad state the original resumes from."""
    problems = _group_problems(state.value, ROW_ADAGRAD, [0])
    if problems:
        return problems
    entries = state.value["state"]
    if set(entries) != {0}:
        return [f"expected state with exactly the entry 0 (the embeddings), found entries {sorted(entries, key=str)}"]
    return _accumulator_problems(entries[0], "state[0]", (count,) if count is not None else None,
                                 ndim=1, meaning="one accumulator per embedding row")


def adagrad_problems(state: OptimizerState, shapes: Sequence[Shape | None] | None) -> list[str]:
    """Why a model file's state is not the Adagrad state the original resumes from.

    ``shapes`` are the model's parameter shapes in the original's parameter order (None when
    unknown: then only the structure is checked, for as many parameters as the group lists).
    """
    value = state.value
    if isinstance(value, dict) and not value:
        if shapes:
            return [f"expected the Adagrad state of {len(shapes)} parameters, found an empty state dict {{}}"]
        return []
    groups = value["param_groups"] if _is_state_dict(value) else []
    params = groups[0].get("params") if groups and isinstance(groups[0], dict) else None
    count = len(shapes) if shapes is not None else (len(params) if isinstance(params, list) else 0)
    problems = _group_problems(value, ADAGRAD, list(range(count)))
    if problems:
        return problems
    entries = value["state"]
    extra = sorted((k for k in entries if k not in range(count)), key=str)
    if extra:
        return [f"expected state entries 0 … {count - 1} (one per parameter), found also {extra}"]
    for index in range(count):
        entry = entries.get(index)
        where = f"state[{index}]"
        if not isinstance(entry, dict):
            return [f"expected {where} with 'step' and 'sum' (every parameter needs them), found "
                    f"{'none' if entry is None else type(entry).__name__}"]
        step = entry.get("step")
        if not (_is_number(step) or (isinstance(step, TensorRef) and step.numel == 1)):
            return [f"expected {where}['step'] to be a number or a one-element tensor, found {_describe(step)}"]
        shape = shapes[index] if shapes is not None else None
        problems = _accumulator_problems(entry, where, shape, ndim=None, meaning="the parameter's shape")
        if problems:
            return problems
    return []


def accumulators(state: OptimizerState) -> list[tuple[str, TensorRef]]:
    """Every ``sum`` tensor of a state that passed its structure check, with where it is."""
    value = state.value
    if not _is_state_dict(value):
        return []
    return [(f"state[{key}]['sum']", entry["sum"]) for key, entry in value["state"].items()
            if isinstance(entry, dict) and isinstance(entry.get("sum"), TensorRef)]


def accumulator_value_problem(state: OptimizerState, where: str, ref: TensorRef) -> str | None:
    """Why an accumulator's values are unusable (non-finite or negative), read block by block."""
    offset = 0
    for block in state.blocks(ref):
        bad = ~(np.isfinite(block) & (block >= 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return f"expected finite accumulators ≥ 0 in {where}, found {block[i]} at flat index {offset + i}"
        offset += len(block)
    return None


def _is_state_dict(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("state"), dict)
            and isinstance(value.get("param_groups"), list))


def _group_problems(value: Any, spec: OptimizerSpec, params: list[int]) -> list[str]:
    if not _is_state_dict(value):
        found = f"keys {sorted(value, key=str)}" if isinstance(value, dict) else type(value).__name__
        return [f"expected an optimizer state dict {{'state': {{...}}, 'param_groups': [...]}}, found {found}"]
    groups = value["param_groups"]
    if len(groups) != 1 or not isinstance(groups[0], dict):
        return [f"expected exactly one param group, found {len(groups)}"]
    group = groups[0]
    for key in spec.group_keys:
        if key.name not in group:
            return [f"expected param_groups[0][{key.name!r}] ({key.requirement}), found none; the original's "
                    f"{spec.optimizer} reads it at every step"]
        if not key.accepts(group[key.name]):
            return [f"expected param_groups[0][{key.name!r}] to be {key.requirement}, found {group[key.name]!r}"]
    if group.get("params") != params:
        return [f"expected param_groups[0]['params'] = {_short(params)} ({spec.params}), "
                f"found {_short(group.get('params'))}"]
    return []


def _accumulator_problems(entry: Any, where: str, shape: Shape | None, *, ndim: int | None,
                          meaning: str) -> list[str]:
    total = entry.get("sum") if isinstance(entry, dict) else None
    if not isinstance(total, TensorRef):
        return [f"expected {where}['sum'] to be a tensor ({meaning}), found {_describe(total)}"]
    if total.dtype != ACCUMULATOR_DTYPE:
        return [f"expected {where}['sum'] of dtype {ACCUMULATOR_DTYPE}, found {total.dtype}"]
    if ndim is not None and len(total.shape) != ndim:
        return [f"expected {where}['sum'] with {ndim} dimension(s), found shape {total.shape}"]
    if shape is not None and total.shape != tuple(shape):
        return [f"expected {where}['sum'] of shape {tuple(shape)} ({meaning}), found {total.shape}"]
    return []


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _describe(value: Any) -> str:
    if isinstance(value, TensorRef):
        return f"a {value.dtype} tensor of shape {value.shape}"
    return "none" if value is None else repr(value)[:60]


def _short(values: Any) -> str:
    if isinstance(values, list) and len(values) > 6:
        return f"[{', '.join(map(str, values[:3]))}, …, {values[-1]}] ({len(values)} entries)"
    return repr(values)


# --------------------------------------------------------------------------- what readers use


def decode_row_adagrad(blob: bytes | IO[bytes], source: str, *, count: int | None = None) -> NDArray[np.float32]:
    """The per-row accumulators of an embeddings file's blob (float32, one per row)."""
    state = read_state(blob, source)
    problems = row_adagrad_problems(state, count)
    if problems:
        raise FormatError(rule("optimizer-state-embeddings").issue(source, OPTIMIZER_DATASET, problems[0]))
    sums = state.array(state.value["state"][0]["sum"])
    return np.ascontiguousarray(sums, dtype=np.float32)


def decode_adagrad(blob: bytes | IO[bytes], source: str, shapes: Sequence[Shape]) -> dict[str, Any] | None:
    """A model file's Adagrad state with numpy arrays for tensors (None for the empty state ``{}``).

    ``shapes`` are the model's parameter shapes in the original's parameter order.
    """
    state = read_state(blob, source)
    problems = adagrad_problems(state, shapes)
    if problems:
        raise FormatError(rule("optimizer-state-model").issue(source, OPTIMIZER_DATASET, problems[0]))
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
