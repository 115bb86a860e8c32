"""Optimizer-state blobs (``optimizer/state_dict``): what the original needs to resume from them.

Both kinds of checkpoint file may hold the bytes of ``torch.save(optimizer.state_dict())``.
The original loads them with ``torch.load`` (``weights_only=True`` since torch 2.6), hands
them to its optimizer's ``load_state_dict`` and steps: an embeddings file holds the
:data:`ROW_ADAGRAD` state of its partition, the model file the :data:`ADAGRAD` state (the
original's ``AsyncAdagrad``, a torch ``Adagrad``) of the model parameters. A key missing here
is a ``KeyError`` at the original's first step, a wrong shape a failed update.

>>> [key.name for key in ROW_ADAGRAD.group_keys]
['lr', 'lr_decay', 'weight_decay']
>>> ROW_ADAGRAD.group_keys[1].accepts(0), ROW_ADAGRAD.group_keys[1].accepts(0.5)
(True, False)
>>> STORAGE_DTYPES["FloatStorage"]
'float32'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

STORAGE_DTYPES: dict[str, str] = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}
"""Storage classes a payload may name (``torch.{name}``), by the dtype of their elements."""

REBUILD_TENSOR = "torch._utils._rebuild_tensor_v2"
ORDERED_DICT = "collections.OrderedDict"
PAYLOAD_GLOBALS: frozenset[str] = frozenset(
    {REBUILD_TENSOR, ORDERED_DICT, *(f"torch.{name}" for name in STORAGE_DTYPES)})
"""Every global a blob may name. Each is allowed by ``torch.load(weights_only=True)``, so a blob
that names nothing else loads there; pbgio never imports or calls anything a blob names."""

ACCUMULATOR_DTYPE = "float32"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _non_negative(value: Any) -> bool:
    return _is_number(value) and value >= 0


def _zero(value: Any) -> bool:
    return _is_number(value) and value == 0


def _positive(value: Any) -> bool:
    return _is_number(value) and value > 0


@dataclass(frozen=True)
class GroupKey:
    """A key every ``param_groups`` entry needs: what it must hold, and what pbgtrain writes."""

    name: str
    requirement: str
    accepts: Callable[[Any], bool]
    written: str


@dataclass(frozen=True)
class StateKey:
    """A key of each parameter's entry in ``state``."""

    name: str
    requirement: str


@dataclass(frozen=True)
class OptimizerSpec:
    """The state dict one kind of checkpoint file holds."""

    optimizer: str
    file: str
    params: str
    group_keys: tuple[GroupKey, ...]
    state_keys: tuple[StateKey, ...]
    why: str


_LR = GroupKey("lr", "a number ≥ 0", _non_negative, "the config's `lr` (`relation_lr` for the model)")

ROW_ADAGRAD = OptimizerSpec(
    optimizer="RowAdagrad",
    file="embeddings",
    params="one: the partition's embeddings, index 0",
    group_keys=(
        _LR,
        GroupKey("lr_decay", "0 (RowAdagrad refuses any other value)", _zero, "0"),
        GroupKey("weight_decay", "0 (a decay on sparse gradients fails)", _zero, "0"),
    ),
    state_keys=(StateKey("sum", "float32, shape `(count,)`: one accumulator per embedding row, ≥ 0"),),
    why="the original's RowAdagrad reads `weight_decay` at every step, and loading a state without "
        "entry 0 leaves it without `sum`",
)

ADAGRAD = OptimizerSpec(
    optimizer="AsyncAdagrad (torch Adagrad)",
    file="model",
    params="every model parameter the config defines, in the original's parameter order: lhs "
           "operators, rhs operators, then global embeddings in the config's order of entity types "
           "(the state is matched to parameters by position), indices 0 … P-1",
    group_keys=(
        _LR,
        GroupKey("lr_decay", "a number ≥ 0", _non_negative, "0"),
        GroupKey("weight_decay", "a number ≥ 0", _non_negative, "0"),
        GroupKey("eps", "a number > 0", _positive, "1e-10"),
    ),
    state_keys=(
        StateKey("step", "the number of steps taken: a number or a one-element tensor"),
        StateKey("sum", "float32 with the parameter's shape: the squared-gradient accumulator, ≥ 0"),
    ),
    why="the original's AsyncAdagrad reads `lr_decay`, `weight_decay` and `eps` from the group and "
        "`step` and `sum` of every parameter at every step; a model without parameters stores `{}` "
        "(or no blob)",
)

OPTIMIZER_SPECS: dict[str, OptimizerSpec] = {spec.file: spec for spec in (ROW_ADAGRAD, ADAGRAD)}


@dataclass(frozen=True)
class StorageRef:
    """One raw storage of a payload: its key, element dtype and element count."""

    key: str
    dtype: str
    numel: int


@dataclass(frozen=True)
class TensorRef:
    """A tensor of a payload: a strided view into a storage (data read on request)."""

    storage: StorageRef
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def dtype(self) -> str:
        return self.storage.dtype

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    def extent(self) -> int:
        """One past the last storage element the view touches (0 for an empty tensor)."""
        if self.numel == 0:
            return 0
        return self.offset + 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride, strict=True))

    def is_contiguous(self) -> bool:
        if self.numel == 0:
            return True
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True
