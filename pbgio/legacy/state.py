"""Convert legacy tensors and optimizer states into today's arrays and blobs.

* Embeddings (an ``nn.Parameter`` or a tensor) become float32 numpy arrays.
* Model state dicts get today's parameter names (:data:`~pbgio.legacy.spec.PARAM_RENAMES`,
  ``rotation`` transposed into ``linear_transformation``) and today's parameter
  order; the model optimizer's per-parameter state follows both (its ``sum`` is
  transposed with its parameter, its indices follow the new order).
* The embeddings' RowAdagrad state keeps its ``sum``; the legacy ``step`` int is
  dropped (today's RowAdagrad keeps no step, and the legacy one never used it).
* Both are re-serialized with ``torch.save`` into the bytes of the ``optimizer/state_dict`` blob.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from pbgio.legacy.spec import PRIVATE_GLOBAL_RE, PRIVATE_OPERATOR_RE, legacy_error, migrate_param_key
from pbgio.spec.checkpoint import OPERATORS, private_to_public

if TYPE_CHECKING:
    from pbgio.config import ConfigSchema

Float32Array = NDArray[np.float32]
DROPPED_ROW_ADAGRAD_KEYS = ("step",)


def is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def to_float32(value: Any, source: str, what: str) -> Float32Array:
    """A float32 C-ordered copy of a tensor (or Parameter); anything else is an error."""
    if not is_tensor(value):
        raise legacy_error("legacy-structure", source,
                           f"expected {what} as a tensor, found {type(value).__name__}")
    if not value.is_floating_point():
        raise legacy_error("legacy-structure", source, f"expected {what} as floats, found {value.dtype}")
    array = value.detach().cpu().float().contiguous().numpy()
    return np.ascontiguousarray(array, dtype=np.float32)


def serialize(state: Any) -> bytes:
    """``torch.save`` bytes (zip container), as today's checkpoints store optimizer state."""
    from pbgio.optimizer_state import encode_state_dict

    return encode_state_dict(state)


def _plain(value: Any) -> Any:
    """Tensors detached to plain CPU tensors (not Parameters); containers copied."""
    if is_tensor(value):
        return value.detach().cpu().clone()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _check_optimizer(state: Any, source: str, what: str) -> tuple[Mapping[Any, Any], list[dict[str, Any]]]:
    if not isinstance(state, Mapping) or not isinstance(state.get("state"), Mapping) \
            or not isinstance(state.get("param_groups"), list) \
            or not all(isinstance(g, Mapping) and isinstance(g.get("params"), list)
                       for g in state["param_groups"]):
        raise legacy_error("legacy-structure", source,
                           f"expected the {what} as a torch optimizer state dict "
                           "({'state': {...}, 'param_groups': [...]}), found "
                           f"{type(state).__name__}")
    return state["state"], [dict(g) for g in state["param_groups"]]


def migrate_embeddings_optimizer(state: Any, source: str) -> dict[str, Any] | None:
    """Today's RowAdagrad state for a legacy one (None stays None): ``step`` dropped."""
    if state is None:
        return None
    per_param, groups = _check_optimizer(state, source, "embeddings optimizer state")
    return {
        "state": {pid: {k: _plain(v) for k, v in entry.items() if k not in DROPPED_ROW_ADAGRAD_KEYS}
                  if isinstance(entry, Mapping) else _plain(entry)
                  for pid, entry in per_param.items()},
        "param_groups": [_plain(g) for g in groups],
    }


@dataclass
class MigratedModel:
    """Model parameters by public name, in today's order, and the optimizer state that follows them."""

    params: dict[str, Float32Array]
    optimizer: dict[str, Any] | None
    renamed: dict[str, str] = field(default_factory=dict)  # legacy key -> today's key
    transposed: list[str] = field(default_factory=list)  # today's keys
    warnings: list[str] = field(default_factory=list)


def _order_key(key: str, position: int, config: ConfigSchema | None) -> tuple[int, int, int, int]:
    """Where today's model registers a parameter: lhs operators, rhs operators, global embeddings."""
    m = PRIVATE_OPERATOR_RE.match(key)
    if m:
        idx, param = int(m["idx"]), m["param"]
        names: Sequence[str] = ()
        if config is not None and idx < len(config.relations):
            spec = OPERATORS.get(config.relations[idx].operator)
            if spec is not None:
                names = list(spec.dynamic_params if config.dynamic_relations else spec.static_params)
        order = names.index(param) if param in names else len(names) + position
        return (0 if m["side"] == "lhs" else 1, idx, order, position)
    m = PRIVATE_GLOBAL_RE.match(key)
    if m:
        types = list(config.entities) if config is not None else []
        order = types.index(m["type"]) if m["type"] in types else len(types) + position
        return (2, order, 0, position)
    return (3, 0, 0, position)


def migrate_model(state: Any, optimizer: Any, config: ConfigSchema | None, source: str) -> MigratedModel:
    """Today's model parameters and model optimizer state for a legacy METADATA's pair."""
    if not isinstance(state, Mapping):
        raise legacy_error("legacy-structure", source,
                           f"expected the model state dict as a dict, found {type(state).__name__}")
    legacy_keys = [k for k in state if not str(k).startswith(("lhs_embs", "rhs_embs"))]
    out = MigratedModel({}, None)
    new_key_of: dict[str, str] = {}
    for key in legacy_keys:
        if not isinstance(key, str):
            raise legacy_error("legacy-structure", source, f"expected string state-dict keys, found {key!r}")
        new_key, transpose = migrate_param_key(key)
        if private_to_public(new_key) is None:
            raise legacy_error("legacy-structure", source,
                               f"expected model keys {{lhs,rhs}}_operators.N.PARAM or global_embs.emb_TYPE, "
                               f"found {key!r}")
        new_key_of[key] = new_key
        if new_key != key:
            out.renamed[key] = new_key
        if transpose:
            out.transposed.append(new_key)
    positions = {k: i for i, k in enumerate(legacy_keys)}
    ordered = sorted(legacy_keys, key=lambda k: _order_key(new_key_of[k], positions[k], config))
    for key in ordered:
        array = to_float32(state[key], source, f"model parameter {key}")
        if new_key_of[key] in out.transposed:
            array = np.ascontiguousarray(np.swapaxes(array, -1, -2))
        public = private_to_public(new_key_of[key])
        assert public is not None
        out.params[public] = array
    out.optimizer = _migrate_model_optimizer(optimizer, legacy_keys, ordered,
                                             {k for k in legacy_keys if new_key_of[k] in out.transposed},
                                             source, out.warnings)
    return out


def _migrate_model_optimizer(optimizer: Any, legacy_keys: list[str], ordered: list[str], transposed: set[str],
                             source: str, warnings: list[str]) -> dict[str, Any] | None:
    if optimizer is None:
        return None
    per_param, groups = _check_optimizer(optimizer, source, "model optimizer state")
    ids = [pid for g in groups for pid in g["params"]]
    if len(ids) != len(legacy_keys):
        warnings.append(f"{source}: the model optimizer state covers {len(ids)} parameters but the model "
                        f"has {len(legacy_keys)}; it is dropped (optimizer state is optional)")
        return None
    id_of = dict(zip(legacy_keys, ids, strict=True))

    def entry(key: str) -> Any:
        value = per_param.get(id_of[key])
        if value is None:
            return None
        value = _plain(value)
        if key in transposed and isinstance(value, dict):
            value = {k: (v.transpose(-1, -2).contiguous() if is_tensor(v) and v.dim() >= 2 else v)
                     for k, v in value.items()}
        return value

    if len(groups) != 1:
        warnings.append(f"{source}: the model optimizer has {len(groups)} parameter groups; its parameter "
                        "order is kept as it was")
        return {"state": {id_of[k]: e for k in legacy_keys if (e := entry(k)) is not None},
                "param_groups": [_plain(g) for g in groups]}
    state = {}
    for new_id, key in enumerate(ordered):
        value = entry(key)
        if value is not None:
            state[new_id] = value
    group = _plain(groups[0])
    group["params"] = list(range(len(ordered)))
    return {"state": state, "param_groups": [group]}
