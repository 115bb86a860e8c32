"""The rules of the optimizer blob of checkpoint files (``optimizer/state_dict``).

The blob is a ``torch.save`` payload that :mod:`pbgio.optimizer_state` decodes without torch
into a state dict with :class:`~pbgio.spec.optimizer.TensorRef` leaves; the predicates here
say why such a state is not the one the original resumes from (:mod:`pbgio.spec.optimizer`
declares it), and the issue builders give each rule its one message form.

>>> state = {"state": {0: {}}, "param_groups": [{"lr": 0.1, "lr_decay": 0, "weight_decay": 0, "params": [0]}]}
>>> row_adagrad_problems(state, count=2)
["expected state[0]['sum'] to be a tensor (one accumulator per embedding row), found none"]
>>> state_issue("model.v1.h5", adagrad_problems({}, shapes=[(2,)]), model=True).message
'expected the Adagrad state of 1 parameters, found an empty state dict {}'

"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pbgio.errors import Issue
from pbgio.spec.checkpoint import OPTIMIZER_DATASET
from pbgio.spec.optimizer import ACCUMULATOR_DTYPE, ADAGRAD, ROW_ADAGRAD, OptimizerSpec, TensorRef
from pbgio.spec.rules import rule

Shape = tuple[int, ...]


def blob_issue(file: str | None, message: str) -> Issue:
    """``optimizer-blob``: the blob is no safe, complete torch payload (``message`` says why)."""
    return rule("optimizer-blob").issue(file, OPTIMIZER_DATASET, message)


def blob_dataset(file: str | None, kind: str | None, ndim: int | None = None,
                 dtype: np.dtype[Any] | None = None) -> Issue | None:
    """``optimizer-blob`` of the dataset that holds the blob: one-dimensional opaque bytes
    (``|V1``); ``kind`` names what the member is when it is no dataset (``ndim`` None)."""
    if ndim is None or dtype is None:
        return blob_issue(file, f"expected a 1-D |V1 blob, found a {str(kind).lower()}")
    if ndim != 1 or dtype.itemsize != 1 or dtype.kind != "V":
        return blob_issue(file, f"expected a 1-D |V1 blob, found {ndim}-D {dtype}")
    return None


def payload_issue(file: str | None, problem: str) -> Issue:
    """``optimizer-blob`` of a payload that does not load safely (``problem`` says where)."""
    return blob_issue(file, f"expected a torch.save payload that torch.load(weights_only=True) loads, found one "
                            f"where {problem}")


def state_issue(file: str | None, problems: Sequence[str], *, model: bool) -> Issue | None:
    """``optimizer-state-model`` (``model``) or ``optimizer-state-embeddings``: the first of the
    ``problems`` :func:`adagrad_problems` or :func:`row_adagrad_problems` found."""
    if not problems:
        return None
    return rule("optimizer-state-model" if model else "optimizer-state-embeddings").issue(
        file, OPTIMIZER_DATASET, problems[0])


def values_issue(file: str | None, problem: str | None) -> Issue | None:
    """``optimizer-state-values``: what :func:`accumulator_value_problem` found, if anything."""
    return None if problem is None else rule("optimizer-state-values").issue(file, OPTIMIZER_DATASET, problem)


def row_adagrad_problems(value: Any, count: int | None) -> list[str]:
    """Why an embeddings file's state ``value`` is not the RowAdagrad state the original resumes from."""
    problems = _group_problems(value, ROW_ADAGRAD, [0])
    if problems:
        return problems
    entries = value["state"]
    if set(entries) != {0}:
        return [f"expected state with exactly the entry 0 (the embeddings), found entries {sorted(entries, key=str)}"]
    return _accumulator_problems(entries[0], "state[0]", (count,) if count is not None else None,
                                 ndim=1, meaning="one accumulator per embedding row")


def adagrad_problems(value: Any, shapes: Sequence[Shape | None] | None) -> list[str]:
    """Why a model file's state ``value`` is not the Adagrad state the original resumes from.

    ``shapes`` are the model's parameter shapes in the original's parameter order (None when
    unknown: then only the structure is checked, for as many parameters as the group lists).
    """
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


def accumulators(value: Any) -> list[tuple[str, TensorRef]]:
    """Every ``sum`` tensor of a state that passed its structure check, with where it is."""
    if not _is_state_dict(value):
        return []
    return [(f"state[{key}]['sum']", entry["sum"]) for key, entry in value["state"].items()
            if isinstance(entry, dict) and isinstance(entry.get("sum"), TensorRef)]


def accumulator_value_problem(blocks: Iterable[NDArray[Any]], where: str) -> str | None:
    """Why an accumulator's values (``blocks`` of them) are unusable (non-finite or negative)."""
    offset = 0
    for block in blocks:
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


