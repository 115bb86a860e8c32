"""How a line of delimited text splits into fields: the delimiter's names, RFC 4180 quoting
(:func:`split_fields`), and which delimiters are quoted by default (:func:`default_quote`).
:mod:`pbgio.importers.read` (edge lists) and ``pbgtrain predict --triples`` / ``--queries``
(:func:`delimited_lines`) split lines here.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

WHITESPACE = "whitespace"
QUOTE = '"'
READ_BYTES = 4 << 20
_DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "space": " ", "semicolon": ";",
                    "pipe": "|", WHITESPACE: WHITESPACE}


def split_fields(text: str, delimiter: str, quote: str | None = None) -> list[str] | None:
    """The fields of one line: split on ``delimiter`` (``"whitespace"``: runs of spaces and tabs);
    with ``quote``, RFC 4180 quoting (None when the quoting is malformed).

    >>> split_fields('a,"b, c",d', ",", '"'), split_fields('x,"a ""b"" c",', ",", '"')
    (['a', 'b, c', 'd'], ['x', 'a "b" c', ''])
    >>> split_fields('a,"open', ",", '"') is None, split_fields('a,"b"c', ",", '"') is None
    (True, True)
    """
    if delimiter == WHITESPACE:
        return text.split()
    if quote is None or quote not in text:
        return text.split(delimiter)
    try:
        rows = list(csv.reader([text], delimiter=delimiter, quotechar=quote, doublequote=True, strict=True))
    except csv.Error:
        return None
    return rows[0] if rows else [""]


def split_lines(lines: Sequence[str], delimiter: str, quote: str) -> list[list[str] | None]:
    """:func:`split_fields` of many lines at once, through one C-level ``csv`` reader (a new one
    only after a malformed line): each line on its own, None for a malformed one. A quoted field
    left open at the end of its line is malformed here (the reader would carry it into the next
    line); the lines after it are read again on their own.

    >>> split_lines(['a,"b, c"', '"open,x', 'd,e', '"f""g",h'], ",", '"')
    [['a', 'b, c'], None, ['d', 'e'], ['f"g', 'h']]
    """
    out: list[list[str] | None] = []
    start = 0
    while start < len(lines):
        reader = csv.reader(itertools.islice(lines, start, None), delimiter=delimiter, quotechar=quote,
                            doublequote=True, strict=True)
        try:
            for row in reader:
                if reader.line_num - (len(out) - start) > 1:  # the row ran over into the next line(s)
                    break
                out.append(row if row else [""])
            else:
                return out
        except csv.Error:
            pass
        out.append(None)  # the line the reader failed on, or whose row ran over
        start = len(out)
    return out


def default_quote(delimiter: str) -> str | None:
    """The quote of ``"auto"``: CSV-like text is quoted as CSV writers quote it; tab-separated text
    (IANA's TSV has no quoting) and whitespace-separated text are not.

    >>> default_quote(","), default_quote("\\t"), default_quote(WHITESPACE)
    ('"', None, None)
    """
    return None if delimiter in ("\t", WHITESPACE) else QUOTE


def quote_for(delimiter: str, quote: str | None) -> str | None:
    """The quote to split with: ``quote``, or for ``"auto"`` the delimiter's default (:func:`default_quote`)."""
    return default_quote(delimiter) if quote == "auto" else quote


def delimited_lines(text: str, delimiter: str, quote: str | None = "auto"
                    ) -> Iterator[tuple[int, str, list[str] | None, str]]:
    """``(line number, line, its fields or None when its quoting is malformed, how the delimiter is
    named)`` of each non-blank line of ``text``, split as ``pbgio import`` splits.

    >>> [fields for _, _, fields, _ in delimited_lines('a,"b, c"\\n\\nd,e\\n', ",")]
    [['a', 'b, c'], ['d', 'e']]
    """
    quote = quote_for(delimiter, quote)
    shown = "whitespace" if delimiter == WHITESPACE else repr(delimiter)
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield number, line, split_fields(line, delimiter, quote), shown


def parse_delimiter(text: str) -> str:
    """A delimiter from its command-line spelling.

    >>> [parse_delimiter(t) for t in ("tab", "\\\\t", ",", "comma", "whitespace")]
    ['\\t', '\\t', ',', ',', 'whitespace']
    """
    named = _DELIMITER_NAMES.get(text.lower())
    if named is not None:
        return named
    if len(text) == 1:
        return text
    raise ValueError(f"expected one character, tab, comma, space, semicolon, pipe or whitespace as the "
                     f"delimiter, found {text!r}")


def delimiter_name(delimiter: str) -> str:
    """How ``-d`` spells ``delimiter`` (its name where it has one).

    >>> delimiter_name("\\t"), delimiter_name(","), delimiter_name(":")
    ('tab', 'comma', "':'")
    """
    for name, value in _DELIMITER_NAMES.items():
        if value == delimiter and name != "\\t":
            return name
    return repr(delimiter)


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
    declare: none of its values occurs in those columns of the other rows, and one of them is a
    usual column name (:data:`COLUMN_NAMES`); else None. Fewer than two rows: None.

    >>> header_like([["source", "relation", "target"], ["a", "r", "b"], ["b", "r", "c"]], [0, 1, 2])
    ['source', 'relation', 'target']
    >>> header_like([["a", "r", "b"], ["b", "r", "c"]], [0, 1, 2]) is None
    True
    """
    if len(rows) < 2 or any(len(rows[0]) <= c for c in columns):
        return None
    first = [rows[0][c] for c in columns]
    seen = {row[c] for row in rows[1:] for c in columns if c < len(row)}
    if any(value in seen for value in first):
        return None
    return first if any(value.strip().lower() in COLUMN_NAMES for value in first) else None


def holds(block: bytes | Path, quote: str) -> bool:
    """Whether a block of lines (or a whole file, read a block at a time) holds the quote."""
    mark = quote.encode("utf-8")
    if isinstance(block, bytes):
        return mark in block
    with block.open("rb") as f:
        return any(mark in chunk for chunk in iter(lambda: f.read(READ_BYTES), b""))
