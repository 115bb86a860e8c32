"""``-p key.path=value``: the overrides of a run config, applied as the original applies them.

Every command that takes a config takes ``-p`` overrides; :meth:`pbgio.layout.Layout.load`
applies them (:func:`override_config_dict`) to the config's dict before it is validated, the
same way for a JSON config, the original's Python config (:func:`load_python_config`) and a
config already in memory. Field types come from :class:`pbgio.config.ConfigSchema`.

>>> import pathlib, tempfile
>>> cfg_py = pathlib.Path(tempfile.mkdtemp()) / "config.py"
>>> _ = cfg_py.write_text('''
... def get_torchbiggraph_config():
...     return dict(entities={"user": {"num_partitions": 1}},
...                 relations=[{"name": "follows", "lhs": "user", "rhs": "user"}],
...                 dimension=16, entity_path="data", edge_paths=("data/train",),
...                 checkpoint_path="model")
... ''')
>>> raw = load_python_config(cfg_py, ["num_epochs=3", "relations.0.all_negs=true"], echo=None)
>>> raw["edge_paths"], raw["num_epochs"], raw["relations"][0]["all_negs"]
(['data/train'], 3, 'true')
>>> config_from_python(cfg_py, echo=None).relations[0].name
'follows'
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pbgio.checks.config import schema_issue
from pbgio.config import ConfigSchema, did_you_mean, parse_config
from pbgio.errors import ConfigError, Issue
from pbgio.python_config import DEFAULT_TIMEOUT, Echo, echo_to_stderr, run_python_config


def load_python_config(path: str | Path, overrides: Iterable[str] = (), *, timeout: float = DEFAULT_TIMEOUT,
                       echo: Echo | None = echo_to_stderr) -> dict[str, Any]:
    """The dict ``get_torchbiggraph_config()`` of ``path`` returns, as JSON values, overrides applied
    (the file is **executed** in a subprocess: :func:`pbgio.python_config.run_python_config`)."""
    return override_config_dict(run_python_config(path, timeout=timeout, echo=echo), overrides, str(path))


def config_from_python(path: str | Path, overrides: Iterable[str] = (), *, timeout: float = DEFAULT_TIMEOUT,
                       echo: Echo | None = echo_to_stderr) -> ConfigSchema:
    """:func:`load_python_config` validated by :func:`pbgio.config.parse_config` (every problem, with rule ids)."""
    return parse_config(load_python_config(path, overrides, timeout=timeout, echo=echo), str(path))


class _BadOverride(Exception):
    pass


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """``tp`` without ``Annotated`` and ``Optional``; and whether it was optional."""
    optional = False
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin is typing.Union or origin is types.UnionType:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(tp))
            if len(args) != 1:
                return tp, optional
            tp = args[0]
        else:
            return tp, optional


def _override_type(keys: list[str]) -> tuple[Any, bool]:
    """The type of the field at ``keys`` in :class:`ConfigSchema` (the original's ``extract_nested_type``)."""
    tp: Any = ConfigSchema
    optional = False
    for i, key in enumerate(keys):
        tp, _ = _unwrap(tp)
        where = ".".join(keys[:i]) or "the config"
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if key not in tp.model_fields:
                raise _BadOverride(f"{where} has no key {key!r}{did_you_mean(key, list(tp.model_fields))}")
            tp = tp.model_fields[key].annotation
        elif typing.get_origin(tp) is list:
            if not key.isdigit():
                raise _BadOverride(f"expected an index into the list {where}, found {key!r}")
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            raise _BadOverride(f"{where} is a single value, it has no key {key!r}")
        tp, optional = _unwrap(tp)
    return tp, optional


def _convert(value: str, tp: Any, optional: bool) -> Any:
    if optional and value.strip().lower() in ("null", "none"):
        return None
    if typing.get_origin(tp) is list:
        return value.split(",")
    if tp is int or tp is float:
        try:
            return tp(value)
        except ValueError:
            raise _BadOverride(f"expected {'an int' if tp is int else 'a number'}, found {value!r}") from None
    return value  # str, bool, enum-like: the schema parses the string


def _inject(data: Any, keys: list[str], value: Any) -> None:
    """The original's ``inject_nested_value``: every key but the last must exist."""
    node = data
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        where = ".".join(keys[:i]) or "the config"
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise _BadOverride(f"expected an index below {len(node)} into {where}, found {key!r}")
            if last:
                node[int(key)] = value
            else:
                node = node[int(key)]
        elif isinstance(node, dict):
            if last:
                node[key] = value
            elif key not in node:
                raise _BadOverride(f"{where} has no key {key!r} in this config")
            else:
                node = node[key]
        else:
            raise _BadOverride(f"expected {where} to be a dict or a list, found {type(node).__name__}")


def override_config_dict(data: dict[str, Any], overrides: Iterable[str], source: str = "<config>") -> dict[str, Any]:
    """A copy of ``data`` with ``key.path=value`` overrides applied as the original applies them.

    Dotted paths go into dicts and lists (``relations.0.all_negs``, ``entities.user.num_partitions``);
    the value of a list field is split on commas, of an int or float field converted, of any
    other field left as a string for the schema to parse. Field types come from
    :class:`pbgio.config.ConfigSchema`. One addition to the original: ``null`` or ``none`` sets
    a field that may be null to null. Every bad override is reported, by its key:

    >>> raw = {"entities": {"user": {"num_partitions": 1}}, "edge_paths": ["a"],
    ...        "relations": [{"name": "r", "lhs": "user", "rhs": "user"}]}
    >>> out = override_config_dict(raw, ["edge_paths=a,b", "entities.user.num_partitions=4",
    ...                                  "relations.0.all_negs=true", "lr=0.5", "max_norm=null"])
    >>> out["edge_paths"], out["entities"]["user"], out["relations"][0]["all_negs"], out["lr"], out["max_norm"]
    (['a', 'b'], {'num_partitions': 4}, 'true', 0.5, None)
    >>> try:
    ...     override_config_dict(raw, ["relations.3.name=x", "numEpochs=3", "dimension=big", "lr"])
    ... except ConfigError as e:
    ...     for issue in e.issues:
    ...         print(issue.dataset, "|", issue.message)
    relations.3.name | bad override 'relations.3.name=x': expected an index below 1 into relations, found '3'
    numEpochs | bad override 'numEpochs=3': the config has no key 'numEpochs' (did you mean 'num_epochs'?)
    dimension | bad override 'dimension=big': expected an int, found 'big'
    lr | bad override 'lr': expected key=value, found no '='
    """
    data = copy.deepcopy(data)
    issues: list[Issue] = []
    for override in overrides:
        key, sep, value = override.partition("=")
        keys = key.split(".")
        try:
            if not sep or not key:
                raise _BadOverride("expected key=value, found no '='")
            tp, optional = _override_type(keys)
            _inject(data, keys, _convert(value, tp, optional))
        except _BadOverride as exc:
            issues.append(schema_issue(source, key or override, f"bad override {override!r}: {exc}"))
    if issues:
        raise ConfigError(source, issues)
    return data
