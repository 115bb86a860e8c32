"""The rules of a nearest-neighbour index file (:mod:`pbgio.spec.index`): what it holds, whose
version it is, whether its payload is intact, and whether it still matches its tables.

>>> meta, issue = metadata("index_user.v1.h5", '{"entity_type": "user"}')
>>> meta is None, issue.rule
(True, 'index-foreign')
>>> name = IndexName("user", 2, "cos", "flat")
>>> name_mismatch("index_user.cos.flat.v2.h5", name, {"entity_type": "user", "version": 1}).message
"expected version 2 (the file name's), found version 1: an index belongs to the version it was built from"
>>> name_mismatch("index_user.cos.flat.v2.h5", name, {"entity_type": "user", "version": 2, "metric": "dot",
...                                                    "kind": "flat"}).message
"expected metric 'cos' (the file name's), found metric 'dot': an index file's name says what it holds"
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pbgio.errors import Issue
from pbgio.spec.index import KINDS, LIBRARIES, META_ATTR, META_FIELDS, METRICS, PAYLOAD_DATASET
from pbgio.spec.naming import IndexName
from pbgio.spec.rules import rule

_JSON_TYPES: dict[str, Any] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "number or null": lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                              and 0 <= v <= 1),
    "array of integers": lambda v: isinstance(v, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v),
}
_CHOICES = {"metric": METRICS, "library": LIBRARIES, "kind": KINDS}


def foreign(file: str | None, dataset: str | None, message: str) -> Issue:
    return rule("index-foreign").issue(file, dataset, message)


def payload_dataset(file: str | None, kind: str | None, ndim: int | None = None, dtype: Any = None) -> Issue | None:
    """The payload is a 1-D uint8 dataset."""
    if kind == "Dataset" and ndim == 1 and str(dtype) == "uint8":
        return None
    found = "nothing" if kind is None else f"a {kind}" if kind != "Dataset" else f"a {ndim}-D {dtype} dataset"
    return foreign(file, PAYLOAD_DATASET, f"expected a 1-D uint8 dataset (the serialized index), found {found}")


def metadata(file: str | None, text: str | None) -> tuple[dict[str, Any] | None, Issue | None]:
    """The metadata object of ``text`` (the pbg_index/json attribute), or the issue with it; an
    optional key it lacks (a file written before the key was added) is given its ``absent`` value."""
    if text is None:
        return None, foreign(file, META_ATTR, "expected the index metadata (a JSON object), found no such "
                                              "attribute: not an index pbgio wrote")
    try:
        value = json.loads(text)
    except ValueError as exc:
        return None, foreign(file, META_ATTR, f"expected a JSON object, found text that is not JSON ({exc})")
    if not isinstance(value, dict):
        return None, foreign(file, META_ATTR, f"expected a JSON object, found {type(value).__name__}")
    missing = [key for key, field in META_FIELDS.items() if key not in value and not field.optional]
    if missing:
        return None, foreign(file, META_ATTR, f"expected the keys {', '.join(missing)}, found none of them")
    value = {**{key: field.absent for key, field in META_FIELDS.items() if field.optional}, **value}
    for key, field in META_FIELDS.items():
        if not _JSON_TYPES[field.json_type](value[key]):
            bound = " >= 0" if "integer" in field.json_type else " from 0 to 1" if "number" in field.json_type else ""
            return None, foreign(file, META_ATTR, f"{key}: expected a {field.json_type}{bound}, found {value[key]!r}")
    for key, choices in _CHOICES.items():
        if value[key] not in choices:
            return None, foreign(file, META_ATTR, f"{key}: expected one of {', '.join(choices)}, "
                                                  f"found {value[key]!r}")
    return value, None


def entity_type(file: str | None, meta: Mapping[str, Any], types: Mapping[str, bool]) -> Issue | None:
    """The indexed type is a plain type of the config (``types``: name -> featurized)."""
    name = meta["entity_type"]
    if name not in types:
        return foreign(file, META_ATTR, f"entity_type: expected a type of the config ({', '.join(sorted(types))}), "
                                        f"found {name!r}")
    if types[name]:
        return foreign(file, META_ATTR, f"entity_type: {name!r} is featurized: its rows are features, not "
                                        "entities to search")
    return None


def name_mismatch(file: str | None, name: IndexName, meta: Mapping[str, Any]) -> Issue | None:
    """The metadata names the type, version, metric and kind of the file name (metric and kind
    where the name has them: pbgio 0.1's names, ``index_{type}.v{version}.h5``, do not)."""
    for key, expected in (("entity_type", name.entity_type), ("version", name.version)):
        if meta[key] != expected:
            return rule("index-version-mismatch").issue(
                file, META_ATTR, f"expected {key} {expected!r} (the file name's), found {key} {meta[key]!r}: "
                                 "an index belongs to the version it was built from")
    for key, named in (("metric", name.metric), ("kind", name.kind)):
        if named is not None and meta[key] != named:
            return rule("index-version-mismatch").issue(
                file, META_ATTR, f"expected {key} {named!r} (the file name's), found {key} {meta[key]!r}: "
                                 "an index file's name says what it holds")
    return None


def damaged(file: str | None, meta: Mapping[str, Any], digest: str, size: int) -> Issue | None:
    """The payload's digest is the recorded one."""
    if digest == meta["payload_sha256"]:
        return None
    return unloadable(
        file, f"expected the payload's SHA-256 {meta['payload_sha256'][:16]}…, found "
                               f"{digest[:16]}… over {size:,} bytes: the file is damaged; rebuild it with "
                               "pbgio index build")


def unloadable(file: str | None, message: str) -> Issue:
    """The payload is damaged: its digest differs, or (intact by its digest) it does not load as an
    index of its metadata."""
    return rule("index-damaged").issue(file, PAYLOAD_DATASET, message)


def stale(file: str | None, meta: Mapping[str, Any], rows: Sequence[int], dimension: int,
          fingerprint: str | None) -> Issue | None:
    """The index matches the tables of its version: rows per partition, dimension and fingerprint
    (``fingerprint`` None: not computed, since the rows already differ)."""
    problem = None
    if list(meta["partition_rows"]) != list(rows):
        problem = f"expected partition_rows {list(rows)} (the version's tables), found {meta['partition_rows']}"
    elif meta["dimension"] != dimension:
        problem = f"expected dimension {dimension} (the type's), found {meta['dimension']}"
    elif fingerprint is not None and meta["fingerprint"] != fingerprint:
        problem = ("expected the fingerprint of the version's tables, found another: the tables changed after the "
                   "index was built")
    if problem is None:
        return None
    return rule("index-stale").issue(file, META_ATTR, f"{problem}; a stale index is never used: rebuild it with "
                                                      f"pbgio index build --type {meta['entity_type']}")
