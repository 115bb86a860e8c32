"""Read and write the entity side of a layout (``entity_path``).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_entity_count(d, "user", 0, 3)
>>> write_entity_names(d, "user", 0, ["ann", "bob", "cy"])
>>> read_entity_count(d, "user", 0), read_entity_names(d, "user", 0)
(3, ['ann', 'bob', 'cy'])
>>> (d / "entity_count_user_0.txt").read_text()
'3\\n'
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from json.encoder import encode_basestring_ascii
from typing import Any

from pbgio import atomic
from pbgio.errors import FormatError, MissingArtifactError
from pbgio.spec import naming
from pbgio.spec.entities import NAMES_JSON_INDENT, format_count, parse_count_text
from pbgio.spec.rules import rule
from pbgio.storage import AnyPath


def _read_text(path: AnyPath, what: str, rule_id: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingArtifactError(str(path), what) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FormatError(rule(rule_id).issue(str(path), None, f"expected a text file, found {exc}")) from None


def _read_count(path: AnyPath, what: str, rule_id: str) -> int:
    text = _read_text(path, what, rule_id)
    count = parse_count_text(text)
    if count is None:
        raise FormatError(rule(rule_id).issue(
            str(path), None, f"expected one non-negative integer, found {text[:40]!r}"))
    return count


def _read_name_list(path: AnyPath, what: str, rule_id: str) -> list[str]:
    text = _read_text(path, what, rule_id)
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(rule(rule_id).issue(
            str(path), None, f"expected a JSON list of strings, found invalid JSON ({exc})")) from None
    if not isinstance(value, list):
        raise FormatError(rule(rule_id).issue(
            str(path), None, f"expected a JSON list of strings, found a {type(value).__name__}"))
    bad = [i for i, name in enumerate(value) if not isinstance(name, str)]
    if bad:
        raise FormatError(rule(rule_id).issue(
            str(path), None, f"expected strings, found {type(value[bad[0]]).__name__} "
            f"{value[bad[0]]!r}", rows=tuple(bad[:5]), count=len(bad)))
    return value


def read_entity_count(entity_path: AnyPath, entity_type: str, part: int) -> int:
    return _read_count(entity_path / naming.entity_count_file(entity_type, part),
                       f"entity count of {entity_type!r} partition {part}", "entity-count-format")


def write_entity_count(entity_path: AnyPath, entity_type: str, part: int, count: int) -> None:
    entity_path.mkdir(parents=True, exist_ok=True)
    atomic.write_text(entity_path / naming.entity_count_file(entity_type, part), format_count(count))


def read_entity_names(entity_path: AnyPath, entity_type: str, part: int) -> list[str]:
    return _read_name_list(entity_path / naming.entity_names_file(entity_type, part),
                           f"entity names of {entity_type!r} partition {part}", "entity-names-format")


_NAMES_PER_WRITE = 1 << 16


def write_name_list(path: AnyPath, names: Iterable[str]) -> None:
    """Write a JSON list of names atomically, streamed (memory bounded by one name).

    The bytes are exactly those of ``json.dumps(list(names), indent=4)``, as the original writes:

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "names.json"
    >>> names = ["ann", "b\u00f6b", 'quo"te']
    >>> write_name_list(target, iter(names))
    >>> target.read_text() == json.dumps(names, indent=4)
    True
    """
    sep = ",\n" + " " * NAMES_JSON_INDENT
    names = iter(names)
    with atomic.atomic_target(path) as tmp, tmp.open("w", encoding="utf-8") as out:
        written = False
        while chunk := list(itertools.islice(names, _NAMES_PER_WRITE)):
            out.write(sep if written else "[\n" + " " * NAMES_JSON_INDENT)
            try:
                out.write(sep.join(map(encode_basestring_ascii, chunk)))
            except TypeError:
                bad = next(n for n in chunk if not isinstance(n, str))
                raise TypeError(f"names are strings, got {type(bad).__name__} {bad!r}") from None
            written = True
        out.write("\n]" if written else "[]")


def write_entity_names(entity_path: AnyPath, entity_type: str, part: int, names: Iterable[str]) -> None:
    entity_path.mkdir(parents=True, exist_ok=True)
    write_name_list(entity_path / naming.entity_names_file(entity_type, part), names)


def read_dynamic_rel_count(entity_path: AnyPath) -> int:
    return _read_count(entity_path / naming.DYNAMIC_REL_COUNT, "dynamic relation count",
                       "dynamic-rel-count-format")


def write_dynamic_rel_count(entity_path: AnyPath, count: int) -> None:
    entity_path.mkdir(parents=True, exist_ok=True)
    atomic.write_text(entity_path / naming.DYNAMIC_REL_COUNT, format_count(count))


def read_relation_names(entity_path: AnyPath) -> list[str]:
    return _read_name_list(entity_path / naming.DYNAMIC_REL_NAMES, "relation names",
                           "dynamic-rel-names-format")


def write_relation_names(entity_path: AnyPath, names: Iterable[str]) -> None:
    entity_path.mkdir(parents=True, exist_ok=True)
    write_name_list(entity_path / naming.DYNAMIC_REL_NAMES, names)
