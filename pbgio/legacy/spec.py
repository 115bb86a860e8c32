"""The legacy (.pt era) layout, declared once: file names, config renames, parameter renames.

Everything the legacy reader and the migration know about the original's first
layout (before the switch to HDF5 on 2019-03-01) is spelled out here, and the
migration guide's tables are rendered from these declarations.

>>> parse_embeddings_file("user_2.pt.3"), parse_embeddings_file("user_2.pt")
(('user', 2, 3), ('user', 2, None))
>>> parse_metadata_file("METADATA_1.pt.4")
(1, 4)
>>> migrated = migrate_config_dict({"metric": "cos", "partitionOrder": "chained_symmetric_pairs",
...                                 "numDynamicRels": 0, "model": "f2_model"})
>>> migrated.config  # doctest: +NORMALIZE_WHITESPACE
{'comparator': 'cos', 'bucket_order': 'affinity', 'dynamic_relations': False,
 'workers': 40, 'verbose': 1, 'num_edge_chunks': 1}
>>> migrated.era
'camelCase'
>>> migrate_param_key("rhs_operators.1.rotation")
('rhs_operators.1.linear_transformation', True)
>>> snake("numEdgeChunks"), snake("hogwild_delay"), snake("distributedTreeInitOrder"), snake("lhsID")
('num_edge_chunks', 'hogwild_delay', 'distributed_tree_init_order', 'lhs_i_d')
>>> parse_bucket_file("edges_1_0.h5"), parse_bucket_file("edges_\u0663_0.h5")  # ASCII digits only
((1, 0), None)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pbgio.errors import FormatError, Issue
from pbgio.spec.config_keys import is_mixed_case, mixed_case_to_snake_case
from pbgio.spec.naming import BUCKET_RE as BUCKET_RE
from pbgio.spec.naming import parse_bucket_file as parse_bucket_file

# --------------------------------------------------------------------------- file names

# Numbers in file names are ASCII digits ([0-9], not \d, which matches '٣' and other digits).
ENTITY_COUNT_RE = re.compile(r"^entity_count_(?P<type>.+)_(?P<part>[0-9]+)\.pt$")
DYNAMIC_REL_COUNT = "dynamic_rel_count.pt"
DICTIONARY = "dict.pt"
# Buckets: the legacy layout's edges_{lhs}_{rhs}.h5 are the current layout's names
# (pbgio.spec.naming.BUCKET_RE and parse_bucket_file, imported above, are the one declaration).
METADATA_RE = re.compile(r"^METADATA_(?P<base>[01])\.pt(?:\.(?P<version>[0-9]+))?$")
EMBEDDINGS_RE = re.compile(r"^(?P<type>.+)_(?P<part>[0-9]+)\.pt(?:\.(?P<version>[0-9]+))?$")
VERSION_FILES = ("CHECKPOINT_VERSION", "FILAMENT_CHECKPOINT_VERSION")
"""Checkpoint version file names, newest first (``FILAMENT_…`` until 9e6a290, 2019-01-23)."""

METADATA_FIELDS = ("config", "edge_path_count", "edge_chunk", "model_state", "model_optimizer")
"""The 5-tuple in ``METADATA_{base}.pt[.N]``."""

EMBEDDINGS_FIELDS = ("embeddings", "optimizer")
"""The 2-tuple in ``{type}_{part}.pt[.N]``."""


def parse_entity_count_file(name: str) -> tuple[str, int] | None:
    m = ENTITY_COUNT_RE.match(name)
    return (m["type"], int(m["part"])) if m else None


def parse_metadata_file(name: str) -> tuple[int, int | None] | None:
    """``(index_base, version)`` of a METADATA file name; version None means no suffix (v0)."""
    m = METADATA_RE.match(name)
    if not m:
        return None
    return int(m["base"]), (int(m["version"]) if m["version"] is not None else None)


def parse_embeddings_file(name: str) -> tuple[str, int, int | None] | None:
    """``(type, part, version)`` of ``{type}_{part}.pt[.N]``; not for count/METADATA files."""
    if ENTITY_COUNT_RE.match(name) or METADATA_RE.match(name):
        return None
    m = EMBEDDINGS_RE.match(name)
    if not m:
        return None
    return m["type"], int(m["part"]), (int(m["version"]) if m["version"] is not None else None)


def embeddings_file(entity_type: str, part: int, version: int) -> str:
    """The legacy name: the ``.N`` suffix comes after ``.pt`` and only for N > 0."""
    return f"{entity_type}_{part}.pt" + (f".{version}" if version > 0 else "")


def metadata_file(index_base: int, version: int) -> str:
    return f"METADATA_{index_base}.pt" + (f".{version}" if version > 0 else "")


# --------------------------------------------------------------------------- problems

LEGACY_PROBLEMS: dict[str, str] = {
    "legacy-unsafe-pickle":
        "A pickled .pt file references a global outside the allow-list (refused unless trusted).",
    "legacy-pickle-unreadable": "A .pt file is not a torch.save payload or a pickle, or is truncated.",
    "legacy-structure": "A legacy file holds a value of the wrong shape or type for its name.",
    "legacy-config": "The config stored in METADATA cannot be mapped to the current keys.",
    "legacy-layout-conflict": "The legacy files disagree (index base, versions, counts).",
    "legacy-bucket": "A legacy bucket cannot be read, or is already in the current format.",
    "legacy-not-found": "The directory to convert holds no file of the legacy layout.",
}
"""Error codes of the legacy reader (``Issue.rule`` of the errors it raises).

They are not validator rules: the validator only reports a legacy directory as
``legacy-layout``; these codes say why a migration stopped.
"""


def legacy_error(code: str, file: str | None, message: str, dataset: str | None = None) -> FormatError:
    """A :class:`~pbgio.errors.FormatError` with a legacy problem code."""
    if code not in LEGACY_PROBLEMS:
        raise KeyError(f"unknown legacy problem code: {code}")
    return FormatError(Issue(code, "error", file, dataset, message))


# --------------------------------------------------------------------------- dict.pt


@dataclass(frozen=True)
class LegacyDictionary:
    """``dict.pt``: names by global 0-based index per entity type, and relation names."""

    entities: dict[str, dict[int, str]]
    relations: dict[int, str] | None

    @classmethod
    def from_value(cls, value: Any, path: str) -> LegacyDictionary:
        if not (isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], Mapping)):
            raise legacy_error("legacy-structure", path,
                               "expected (entity dictionaries by type, relation dictionary), found "
                               f"{type(value).__name__}")
        entities = {str(t): cls._ix_to_word(d, path, f"entity type {t!r}") for t, d in value[0].items()}
        relations = cls._ix_to_word(value[1], path, "relations") if value[1] is not None else None
        return cls(entities, relations)

    @staticmethod
    def _ix_to_word(d: Any, path: str, what: str) -> dict[int, str]:
        table = d.get("ix_to_word") if isinstance(d, Mapping) else None
        if not isinstance(table, Mapping) or not all(
                isinstance(k, int) and not isinstance(k, bool) and k >= 0 and isinstance(v, str)
                for k, v in table.items()):
            raise legacy_error("legacy-structure", path,
                               f"expected an ix_to_word table of int → str for {what}")
        return dict(table)

    def relation_names(self) -> list[str | None] | None:
        if self.relations is None:
            return None
        size = max(self.relations, default=-1) + 1
        return [self.relations.get(i) for i in range(size)]


# --------------------------------------------------------------------------- config renames

Scope = Literal["config", "relation", "entity"]


@dataclass(frozen=True)
class KeyRename:
    """A config key the original renamed (beyond camelCase → snake_case)."""

    legacy: str
    current: str | None  # None: dropped
    scope: Scope
    commit: str
    note: str = ""


@dataclass(frozen=True)
class ValueRename:
    """A config value the original renamed; matched case-insensitively."""

    key: str  # current key
    scope: Scope
    legacy: str
    current: str
    commit: str
    note: str = ""


@dataclass(frozen=True)
class ParamRename:
    """A model parameter the original renamed; ``transpose`` swaps the last two axes."""

    legacy: str
    current: str
    transpose: bool
    commit: str
    note: str = ""


KEY_RENAMES: tuple[KeyRename, ...] = (
    KeyRename("outdir", "checkpoint_path", "config", "da69cbc", "the checkpoint (output) directory"),
    KeyRename("loadPath", "init_path", "config", "da69cbc", "the directory of initial embeddings"),
    KeyRename("metric", "comparator", "config", "da69cbc"),
    KeyRename("partitionOrder", "bucket_order", "config", "da69cbc"),
    KeyRename("all_rhs_negs", "all_negs", "relation", "da69cbc"),
    KeyRename("model", None, "config", "da69cbc", "it was always 'f2_model'"),
    KeyRename("numDynamicRels", "dynamic_relations", "config", "070cd4c",
              "the auto-set int became a user-set bool: true when the int was > 0; the count "
              "itself goes to dynamic_rel_count.txt"),
)

VALUE_RENAMES: tuple[ValueRename, ...] = (
    ValueRename("bucket_order", "config", "chained_symmetric_pairs", "affinity", "9310dab"),
    ValueRename("operator", "relation", "affine_rhs", "affine", "da69cbc",
                "its `rotation` parameter becomes `linear_transformation`, transposed"),
    ValueRename("loss_fn", "config", "logit", "logistic", "—", "an old alias of the logistic loss"),
)

PARAM_RENAMES: tuple[ParamRename, ...] = (
    ParamRename("rotation", "linear_transformation", True, "b46709f",
                "the old affine computed x @ R, today's computes W @ x, so W = R.T"),
    ParamRename("rotations", "linear_transformations", True, "b46709f",
                "dynamic form: each relation's matrix is transposed"),
)

LEGACY_DEFAULTS: dict[str, Any] = {
    "workers": 40,
    "verbose": 1,
    "num_edge_chunks": 1,
}
"""Legacy defaults that differ from today's; used for keys a stored legacy config lacks."""

CAMEL_KEYS: tuple[str, ...] = (
    "entityPath", "edgePaths", "numPartitions", "globalEmb", "maxNorm", "initScale", "lossFn",
    "batchSize", "numEpochs", "numEdgeChunks", "numUniformNegs", "numBatchNegs", "evalFraction",
    "evalNumUniformNegs", "evalNumBatchNegs", "numMachines", "numPartitionServers",
    "distributedInitMethod", "distributedTreeInitOrder",
)
"""camelCase keys of the 0035569-era config that only change case (for the docs)."""


snake = mixed_case_to_snake_case
"""camelCase → snake_case: the original's conversion of mixedCase keys, the one of
:mod:`pbgio.spec.config_keys` (``lhsID`` → ``lhs_i_d``, as the original reads it)."""


_KEY_RENAMES = {(r.scope, snake(r.legacy)): r for r in KEY_RENAMES}
_VALUE_RENAMES = {(v.scope, v.key, v.legacy): v for v in VALUE_RENAMES}
_PARAM_RENAMES = {p.legacy: p for p in PARAM_RENAMES}
_DYNAMIC_COUNT_KEY = snake("numDynamicRels")


@dataclass(frozen=True)
class ConfigChange:
    """One change the migration made to the stored config."""

    path: str  # e.g. "relations[1].operator"
    legacy_key: str
    current_key: str | None
    legacy_value: Any
    current_value: Any
    reason: str

    def __str__(self) -> str:
        """``relations[1].operator: 'affine_rhs' → 'affine' (value renamed in da69cbc)`` and the like."""
        parent = self.path[: -len(self.legacy_key)] if self.path.endswith(self.legacy_key) else ""
        if self.current_key is None:
            return f"{self.path} = {self.legacy_value!r}: dropped ({self.reason})"
        if self.current_key == self.legacy_key:
            return f"{self.path}: {self.legacy_value!r} → {self.current_value!r} ({self.reason})"
        value = (f" = {self.legacy_value!r} → {self.current_value!r}"
                 if self.legacy_value != self.current_value else "")
        return f"{self.path} → {parent}{self.current_key}{value} ({self.reason})"


@dataclass
class ConfigMigration:
    """A legacy config dict with today's keys and values (not yet validated)."""

    config: dict[str, Any]
    changes: list[ConfigChange] = field(default_factory=list)
    era: Literal["camelCase", "snake_case"] = "snake_case"
    num_dynamic_rels: int | None = None  # the legacy int, when the config had one


def _migrate_mapping(data: Mapping[str, Any], scope: Scope, where: str, out: ConfigMigration,
                     source: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise legacy_error("legacy-config", source,
                               f"expected string keys in {where or 'the config'}, found {key!r}")
        path = f"{where}.{key}" if where else key
        normalized = snake(key)
        rename = _KEY_RENAMES.get((scope, normalized))
        if rename is not None and rename.current is None:
            out.changes.append(ConfigChange(path, key, None, value, None, rename.note or rename.commit))
            continue
        new_key = rename.current if rename is not None and rename.current else normalized
        new_value = value
        if rename is not None and normalized == _DYNAMIC_COUNT_KEY:
            count = _as_int(value)
            if count is None:
                raise legacy_error("legacy-config", source,
                                   f"expected an integer for {path}, found {value!r}")
            out.num_dynamic_rels = count
            new_value = count > 0
        if rename is not None:
            out.changes.append(ConfigChange(path, key, new_key, value, new_value,
                                            f"renamed in {rename.commit}"))
        elif new_key != key:
            out.changes.append(ConfigChange(path, key, new_key, value, new_value, "camelCase → snake_case"))
        if isinstance(new_value, str):
            vrename = _VALUE_RENAMES.get((scope, new_key, new_value.lower()))
            if vrename is not None:
                out.changes.append(ConfigChange(path, new_key, new_key, new_value, vrename.current,
                                                f"value renamed in {vrename.commit}"))
                new_value = vrename.current
        if new_key in result:
            raise legacy_error("legacy-config", source,
                               f"expected one key for {new_key!r} in {where or 'the config'}, found both "
                               f"{origin[new_key]!r} and {key!r}")
        origin[new_key] = key
        result[new_key] = new_value
    return result


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return None


def migrate_config_dict(legacy: Mapping[str, Any], source: str | None = None) -> ConfigMigration:
    """Today's keys and values for a config dict stored by the legacy code.

    Keys are converted from camelCase, the renames in :data:`KEY_RENAMES` and
    :data:`VALUE_RENAMES` are applied, and :data:`LEGACY_DEFAULTS` fill keys the
    stored dict lacks. Types (``1`` for true …) are left to :func:`pbgio.config.parse_config`.
    """
    out = ConfigMigration({})
    if _has_camel(legacy):
        out.era = "camelCase"
    config = _migrate_mapping(legacy, "config", "", out, source)
    relations = config.get("relations")
    if isinstance(relations, list):
        config["relations"] = [
            _migrate_mapping(rel, "relation", f"relations[{i}]", out, source)
            if isinstance(rel, Mapping) else rel
            for i, rel in enumerate(relations)
        ]
    entities = config.get("entities")
    if isinstance(entities, Mapping):
        config["entities"] = {
            name: _migrate_mapping(ent, "entity", f"entities.{name}", out, source)
            if isinstance(ent, Mapping) else ent
            for name, ent in entities.items()
        }
    if legacy:  # an empty dict is no config at all: nothing to default
        for key, value in LEGACY_DEFAULTS.items():
            if key not in config:
                config[key] = value
                out.changes.append(ConfigChange(key, key, key, None, value, "legacy default"))
    out.config = config
    return out


def _has_camel(data: Mapping[str, Any]) -> bool:
    for key, value in data.items():
        if isinstance(key, str) and is_mixed_case(key):
            return True
        if key == "relations" and isinstance(value, list) and any(
                isinstance(r, Mapping) and _has_camel(r) for r in value):
            return True
        if key == "entities" and isinstance(value, Mapping) and any(
                isinstance(e, Mapping) and _has_camel(e) for e in value.values()):
            return True
    return False


PRIVATE_OPERATOR_RE = re.compile(r"^(?P<side>lhs|rhs)_operators\.(?P<idx>[0-9]+)\.(?P<param>[^./]+)$")
PRIVATE_GLOBAL_RE = re.compile(r"^global_embs\.emb_(?P<type>[^./]+)$")


def migrate_param_key(key: str) -> tuple[str, bool]:
    """Today's state-dict key for a legacy one, and whether the value must be transposed."""
    m = PRIVATE_OPERATOR_RE.match(key)
    if m:
        rename = _PARAM_RENAMES.get(m["param"])
        if rename is not None:
            return f"{m['side']}_operators.{m['idx']}.{rename.current}", rename.transpose
    return key, False


# --------------------------------------------------------------------------- docs


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")


def renames_markdown() -> str:
    """The rename tables of the migration guide (docs/guides/migration.md)."""
    scope_text = {"config": "top level", "relation": "each of `relations`", "entity": "each of `entities`"}
    lines = [
        "| legacy key | current key | where | changed in | note |",
        "|---|---|---|---|---|",
    ]
    for r in KEY_RENAMES:
        spelled = f"`{r.legacy}`" + (f" / `{snake(r.legacy)}`" if snake(r.legacy) != r.legacy else "")
        current = f"`{r.current}`" if r.current else "*(dropped)*"
        lines.append(f"| {spelled} | {current} | {scope_text[r.scope]} | {r.commit} | {_cell(r.note)} |")
    lines += [
        "",
        "Every other camelCase key only changes case: "
        + ", ".join(f"`{k}` → `{snake(k)}`" for k in CAMEL_KEYS) + ". "
        "The case conversion is the original's (`mixed_case_to_lowercase` in its `schema.py`, for every key "
        f"it loads): each capital letter becomes `_` and its lowercase, so `lhsID` → `{snake('lhsID')}`.",
        "",
        "| key | legacy value | current value | changed in | note |",
        "|---|---|---|---|---|",
    ]
    for v in VALUE_RENAMES:
        lines.append(f"| `{v.key}` ({scope_text[v.scope]}) | `{v.legacy}` | `{v.current}` | {v.commit} | "
                     f"{_cell(v.note)} |")
    lines += [
        "",
        "| legacy parameter | current parameter | transform | changed in | note |",
        "|---|---|---|---|---|",
    ]
    for p in PARAM_RENAMES:
        transform = "transpose of the last two axes" if p.transpose else "none"
        lines.append(f"| `{p.legacy}` | `{p.current}` | {transform} | {p.commit} | {_cell(p.note)} |")
    lines += [
        "",
        "| key missing from the stored config | value used (the legacy default) |",
        "|---|---|",
    ]
    for key, value in LEGACY_DEFAULTS.items():
        lines.append(f"| `{key}` | `{value!r}` |")
    return "\n".join(lines) + "\n"


def problems_markdown() -> str:
    """The table of legacy reader error codes (docs/guides/migration.md)."""
    lines = ["| code | meaning |", "|---|---|"]
    lines += [f"| `{code}` | {_cell(text)} |" for code, text in LEGACY_PROBLEMS.items()]
    return "\n".join(lines) + "\n"


GENERATED_BLOCKS = {"renames": renames_markdown, "problems": problems_markdown}
"""Marker name → renderer of the generated blocks in the migration guide."""


def render_guide(text: str) -> str:
    """``text`` with every ``<!-- BEGIN name -->…<!-- END name -->`` block regenerated."""
    for name, render in GENERATED_BLOCKS.items():
        pattern = re.compile(rf"(<!-- BEGIN {name}[^>]*-->\n).*?(<!-- END {name} -->)", re.S)
        text = pattern.sub(lambda m, r=render: m[1] + r() + m[2], text)  # type: ignore[misc]
    return text
