"""The rules of ``entity_path``: count files, names files and the relation files of dynamic mode.

The text of count files and the JSON of names lists are parsed by their readers
(:mod:`pbgio.entities`), which report what they find here:

>>> count_format("entity count", "entity_count_user_0.txt", " 12\\n")
12
>>> print(count_format("dynamic relation count", "dynamic_rel_count.txt", "twelve"))
dynamic_rel_count.txt: expected one non-negative integer, found 'twelve' [dynamic-rel-count-format]
>>> print(count_format("entity count", "entity_count_user_0.txt", str(2**64)))  # doctest: +ELLIPSIS
entity_count_user_0.txt: expected a count of at most 9223372036854775807 (2^63 - 1), found 1844... [entity-count-format]
>>> print(names_count("entity_names_user_0.json", 3, 2, "entity_count_user_0.txt"))
entity_names_user_0.json: expected 3 names (entity_count_user_0.txt), found 2 [entity-names-count]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pbgio.errors import Issue
from pbgio.spec.config import ConfigSchema
from pbgio.spec.entities import parse_count_text
from pbgio.spec.naming import DYNAMIC_REL_COUNT
from pbgio.spec.rules import rule

CountFile = Literal["entity count", "dynamic relation count", "checkpoint version"]
"""The files that hold one non-negative integer (``checkpoint_version.txt`` too)."""
NamesFile = Literal["entity names", "relation names"]
"""The files that hold a JSON list of strings."""
COUNT_MAX = (1 << 63) - 1
"""The largest count a count file may hold (an int64: edge files and tables index rows with them)."""


def _format_rule(kind: CountFile | NamesFile) -> str:
    """The format rule of a count or names file."""
    return {
        "entity count": "entity-count-format",
        "dynamic relation count": "dynamic-rel-count-format",
        "checkpoint version": "checkpoint-version-format",
        "entity names": "entity-names-format",
        "relation names": "dynamic-rel-names-format",
    }[kind]


def count_format(kind: CountFile, file: str | None, text: str) -> int | Issue:
    """The number a count file's ``text`` holds, or the issue of its format rule."""
    count = parse_count_text(text)
    if count is None:
        return rule(_format_rule(kind)).issue(file, None, f"expected one non-negative integer, found {text[:40]!r}")
    if count > COUNT_MAX:  # rows, relation ids and versions are 64-bit integers everywhere they are used
        return rule(_format_rule(kind)).issue(
            file, None, f"expected a count of at most {COUNT_MAX} (2^63 - 1), found {text.strip()[:40]}")
    return count


def text_unreadable(kind: CountFile, file: str | None, found: object) -> Issue:
    """The format rule of a count file that cannot be read as text (``found`` says why)."""
    return rule(_format_rule(kind)).issue(file, None, f"expected a text file, found {found}")


def names_format(kind: NamesFile, file: str | None, message: str, element: int | None = None) -> Issue:
    """The format rule of a names list that is no JSON list of strings: ``message`` (line and what
    was found) about list ``element`` (its index, None for the file as a whole)."""
    rows = () if element is None else (element,)
    return rule(_format_rule(kind)).issue(file, None, message, rows=rows, count=None if element is None else 1)


def count_missing(file: str | None, entity_type: str, part: int, *, first: Sequence[int] = (),
                  total: int = 1) -> Issue:
    """``entity-count-missing``: the count file of a type and partition of the config is absent; with
    ``total`` > 1, one issue for the ``total`` count files of the type that are absent, ``first`` (the
    first few partitions, ``part`` the first of them) listed and ``total`` its count.

    >>> print(count_missing("entity_count_u_3.txt", "u", 3, first=(3, 4, 7), total=9_999_997))
    entity_count_u_3.txt: expected the entity counts of 'u' partitions 3, 4, 7 and 9,999,994 more \
(9,999,997 count files missing), found no file [entity-count-missing]
    """
    if total <= 1:
        return rule("entity-count-missing").issue(
            file, None, f"expected the entity count of {entity_type!r} partition {part}, found no file")
    shown = list(first) or [part]
    more = f" and {total - len(shown):,} more" if total > len(shown) else ""
    return rule("entity-count-missing").issue(
        file, None, f"expected the entity counts of {entity_type!r} partitions {', '.join(map(str, shown))}{more} "
                    f"({total:,} count files missing), found no file", count=total)


def count_extra(file: str | None, entity_type: str, part: int, cfg: ConfigSchema) -> Issue | None:
    """``entity-count-extra``: a count file of a partition or type the config lacks."""
    if entity_type in cfg.entities:
        partitions = cfg.entities[entity_type].num_partitions
        if part < partitions:
            return None
        message = f"expected partitions 0..{partitions - 1} of {entity_type!r}"
    else:
        message = f"expected an entity type of the config {sorted(cfg.entities)}, found {entity_type!r}"
    return rule("entity-count-extra").issue(file, None, message)


def names_count(file: str | None, expected: int, found: int | None, source: str, *,
                at_least: bool = False) -> Issue | None:
    """``entity-names-count``: a names file lists ``expected`` names (the count ``source`` gives:
    a count file, the rows of a checkpoint), found ``found`` (None: more than expected); with
    ``at_least``, a reader needed ``expected`` names and found fewer."""
    if found == expected or (at_least and found is not None and found >= expected):
        return None
    return rule("entity-names-count").issue(
        file, None, f"expected {'at least ' if at_least else ''}{expected} names ({source}), "
        f"found {'more' if found is None else found}")


def names_duplicate(file: str | None, entity_type: str, *, within: Sequence[str] = (), rows: tuple[int, ...] = (),
                    across: Sequence[tuple[str, int, int]] = ()) -> Issue | None:
    """``entity-names-duplicate``: names repeated ``within`` one names file (in order of first
    appearance, ``rows`` where the first ones are), or found ``across`` partitions of a type
    (name, first partition, other partition)."""
    if within:
        return rule("entity-names-duplicate").issue(
            file, None, f"expected unique names, found {len(within)} repeated, e.g. {within[0]!r}",
            rows=rows, count=len(within))
    if across:
        name, first, part = across[0]
        return rule("entity-names-duplicate").issue(
            file, None, f"expected each name of {entity_type!r} in one partition, found {name!r} in partitions "
            f"{first} and {part}" + (f" ({len(across)} names in all)" if len(across) > 1 else ""),
            count=len(across))
    return None


def dynamic_rel_count_missing(file: str | None, cfg: ConfigSchema | None) -> Issue | None:
    """``dynamic-rel-count-missing``: dynamic_rel_count.txt is absent while dynamic_relations is true."""
    if cfg is None or not cfg.dynamic_relations:
        return None
    return rule("dynamic-rel-count-missing").issue(
        file, None, "expected the dynamic relation count (dynamic_relations is true), found no file")


def relation_names(file: str | None, names: Sequence[str], cfg: ConfigSchema | None,
                   dynamic_rel_count: int | None) -> list[Issue]:
    """``dynamic-rel-names-count`` and ``relation-names-mismatch`` of dynamic_rel_names.json
    listing ``names``: as many as the relation count (``dynamic_rel_count`` in dynamic mode, the
    config's relations in static mode), and, in static mode, the config's names in order."""
    issues = []
    dynamic = cfg.dynamic_relations if cfg is not None else dynamic_rel_count is not None
    if dynamic and dynamic_rel_count is not None and len(names) != dynamic_rel_count:
        issues.append(rule("dynamic-rel-names-count").issue(
            file, None, f"expected {dynamic_rel_count} names ({DYNAMIC_REL_COUNT}), found {len(names)}"))
    if cfg is not None and not cfg.dynamic_relations:
        expected = [r.name for r in cfg.relations]
        if len(names) != len(expected):
            issues.append(rule("dynamic-rel-names-count").issue(
                file, None, f"expected {len(expected)} names (the config's relations), found {len(names)}"))
        elif names != expected:
            row = next(i for i, (a, b) in enumerate(zip(names, expected, strict=True)) if a != b)
            issues.append(rule("relation-names-mismatch").issue(
                file, None, f"expected {expected[row]!r} (relations[{row}].name), found {names[row]!r}",
                rows=(row,), count=sum(a != b for a, b in zip(names, expected, strict=True))))
    return issues
