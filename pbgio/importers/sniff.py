"""What the first lines of a text edge list suggest when they do not fit the options given:
another delimiter (:func:`likely_delimiter`, for the error of too few fields), a header the user
did not declare (:func:`refuse_undeclared_header`).

>>> header_like([["source", "relation", "target"], ["a", "r", "b"], ["b", "r", "c"]], [0, 1, 2])
['source', 'relation', 'target']
"""

from __future__ import annotations

from collections.abc import Mapping

from pbgio.errors import InputError
from pbgio.fields import WHITESPACE, default_quote, split_fields

SAMPLE_LINES = 20
"""Lines a suggested delimiter must split alike."""


def likely_delimiter(lines: list[str], needed: int, current: str) -> str | None:
    """The delimiter (other than ``current``) that splits every one of ``lines`` into at least
    ``needed`` fields and all of them into as many, quoted as :func:`default_quote` says; the
    first such of tab, comma, semicolon, pipe, whitespace; None when none does.

    >>> likely_delimiter(["a,b,c", 'd,"e, f",g'], 3, "\\t"), likely_delimiter(["a b"], 3, "\\t")
    (',', None)
    """
    for candidate in ("\t", ",", ";", "|", WHITESPACE):
        if candidate == current or not lines:
            continue
        counts = {len(fields) if fields is not None else 0
                  for fields in (split_fields(line, candidate, default_quote(candidate)) for line in lines)}
        if len(counts) == 1 and counts.pop() >= needed:
            return candidate
    return None


COLUMN_NAMES = frozenset({
    "source", "target", "src", "dst", "dest", "destination", "from", "to", "head", "tail", "subject", "object",
    "predicate", "relation", "rel", "relationship", "relation_type", "edge", "edge_type", "type", "label", "lhs",
    "rhs", "node", "node1", "node2", "node_1", "node_2", "start", "end", "start_id", "end_id", "id1", "id2",
    "parent", "child", "weight", "u", "v", "h", "r", "t", "s", "p", "o",
})
"""Names a header row gives its edge-list columns (compared lower-cased)."""


def header_like(rows: list[list[str]], columns: list[int]) -> list[str] | None:
    """The values of ``rows[0]`` in ``columns`` when that row looks like a header the user did not
    declare: none of its values occurs in those columns of the other rows, and two of them are
    usual column names (:data:`COLUMN_NAMES`; one could be a name like any other: an entity ``s``, a
    relation ``r``); else None. Fewer than two rows: None.

    >>> header_like([["source", "relation", "target"], ["a", "r", "b"], ["b", "r", "c"]], [0, 1, 2])
    ['source', 'relation', 'target']
    >>> header_like([["synset1", "rel", "synset2"], ["a", "r", "b"]], [0, 1, 2]) is None
    True
    >>> header_like([["a", "r", "b"], ["b", "r", "c"]], [0, 1, 2]) is None
    True
    """
    if len(rows) < 2 or any(len(rows[0]) <= c for c in columns):
        return None
    first = [rows[0][c] for c in columns]
    seen = {row[c] for row in rows[1:] for c in columns if c < len(row)}
    if any(value in seen for value in first):
        return None
    return first if sum(value.strip().lower() in COLUMN_NAMES for value in first) >= 2 else None


def refuse_undeclared_header(path: object, rows: list[list[str]], columns: Mapping[str, int],
                              declared: bool | None) -> None:
    """Raise :class:`InputError` (line 1) when the first of ``rows`` (the fields of the first lines)
    looks like a header in the columns of lhs, relation and rhs (``columns``: each role's index) and
    the user said neither ``--header`` nor ``--no-header`` (``declared`` None): imported, it would make
    entities and a relation named after the columns, and nothing would say so."""
    if declared is not None:
        return
    named = header_like(rows, sorted({i for role, i in columns.items() if role in ("lhs", "rel", "rhs")}))
    if named is None:
        return
    raise InputError(str(path), 1, f"expected an edge or a declared header, found a line that looks like a header "
                     f"({', '.join(repr(v) for v in named)}: usual column names among them, none in the next "
                     f"{len(rows) - 1:,} lines). Pass --header if it names the columns, "
                     "or --no-header to import it as an edge")
