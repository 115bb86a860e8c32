"""The run config: load, validate and publish the config of the original PBG.

One pydantic declaration (:class:`ConfigSchema`, in :mod:`pbgio.spec.config`) gives the loader,
the dumper (``config.json`` exactly as the original writes it) and the published JSON
Schema ``schemas/config.schema.json``; the rules across keys are :mod:`pbgio.checks.config`
(:func:`semantic_issues`). This module re-exports both. Values are read as the original reads them (mixedCase
keys such as ``numEpochs`` as ``num_epochs``; an int for a float; ``"yes"``/``1`` for a bool;
not ``"3"`` for an int). Loading reports every problem at once, each with its path:

>>> cfg = parse_config({
...     "entities": {"user": {"num_partitions": 2}},
...     "relations": [{"name": "follows", "lhs": "user", "rhs": "user"}],
...     "dimension": 16, "entity_path": "data", "edge_paths": ["data/train"],
...     "checkpoint_path": "model"})
>>> cfg.comparator, cfg.entity_dimension("user"), cfg.num_partitions("user")
('cos', 16, 2)
>>> try:
...     parse_config({"entities": {}, "relations": [{"name": "r", "lhs": "a", "rhs": "b",
...                    "operatr": "none"}], "dimension": 0, "numEpochs": "3"})
... except ConfigError as e:
...     for issue in e.issues:
...         print(issue.dataset, "|", issue.message)
entities | must not be empty
relations[0].operatr | unknown key 'operatr' (did you mean 'operator'?)
dimension | must be greater than 0, found 0
entity_path | is required
edge_paths | is required
checkpoint_path | is required
num_epochs | expected an integer, found '3'
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from pbgio import storage
from pbgio.checks.config import (
    did_you_mean,
    key_case_issues,
    pydantic_issues,
    semantic_issues,
    unreadable,
)
from pbgio.errors import ConfigError, MissingArtifactError, UsageError
from pbgio.spec.config import (
    CONFIG_KEYS,
    FALSE_STRINGS,
    INT64_MAX,
    INT64_MIN,
    REGULARIZERS,
    TRUE_STRINGS,
    Bool,
    BucketOrder,
    Comparator,
    ConfigSchema,
    EntitySchema,
    Float,
    Int,
    LossFn,
    Operator,
    RelationSchema,
    snake_case_keys,
)
from pbgio.storage import AnyPath

__all__ = [  # the schema and the rules live in pbgio.spec.config and pbgio.checks.config
    "CONFIG_KEYS", "FALSE_STRINGS", "INT64_MAX", "INT64_MIN", "REGULARIZERS", "TRUE_STRINGS", "Bool",
    "BucketOrder", "Comparator", "ConfigSchema", "EntitySchema", "Float", "Int", "LossFn", "Operator",
    "RelationSchema", "config_json_schema", "did_you_mean", "key_case_issues", "load_config", "parse_config",
    "read_config_json", "semantic_issues", "snake_case_keys",
]


def parse_config(data: Any, source: str = "<config>") -> ConfigSchema:
    """Validate a config dict; raise :class:`ConfigError` listing every problem. mixedCase keys
    are read as the original reads them (:func:`snake_case_keys`; :func:`key_case_issues` warns)."""
    if not isinstance(data, dict):
        raise ConfigError(source, [unreadable(source, f"expected a JSON object, found {type(data).__name__}")])
    try:
        cfg = ConfigSchema.model_validate(snake_case_keys(data))
    except ValidationError as exc:
        raise ConfigError(source, pydantic_issues(exc.errors())) from None
    errors = [i for i in semantic_issues(cfg) if i.severity == "error"]
    if errors:
        raise ConfigError(source, errors)
    return cfg


def read_config_json(path: str | AnyPath) -> Any:
    """The JSON value of a config file (a path or URL); :class:`ConfigError` when unreadable."""
    path = storage.resolve(path)
    try:
        return json.loads(storage.remote_call(path, "config", lambda: path.read_text(encoding="utf-8")))
    except (FileNotFoundError, MissingArtifactError):
        raise ConfigError(str(path), [unreadable(str(path), "expected a config file, found nothing at this path")]) \
            from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: invalid JSON, or an integer of more digits than int() converts;
        # RecursionError: nesting deeper than the decoder recurses
        raise ConfigError(str(path), [unreadable(str(path), f"expected a JSON document, found {_json_failure(exc)}")]) \
            from None


def _json_failure(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nesting too deep to decode"
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


def entity_type_or_only(config: ConfigSchema, entity_type: str | None) -> str:
    """``entity_type`` when given, else the config's only entity type (``--type`` by default); none
    given while the config has several is a :class:`~pbgio.errors.UsageError` naming them.

    >>> cfg = parse_config({"entities": {"user": {"num_partitions": 1}}, "dimension": 8, "entity_path": "data",
    ...                     "relations": [{"name": "f", "lhs": "user", "rhs": "user"}], "edge_paths": ["data/e"],
    ...                     "checkpoint_path": "model"})
    >>> entity_type_or_only(cfg, None)
    'user'
    """
    if entity_type is not None:
        return entity_type
    types = sorted(config.entities)
    if len(types) != 1:
        raise UsageError(f"give the entity type (--type): the config has {len(types)}, {', '.join(types)}")
    return types[0]


def load_config(path: str | AnyPath) -> ConfigSchema:
    """Load and validate a JSON config file."""
    return parse_config(read_config_json(path), str(path))


def config_json_schema() -> dict[str, Any]:
    """The published JSON Schema of the run config."""
    schema = ConfigSchema.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://pbg.dev/schemas/config.schema.json",
        **schema,
    }
