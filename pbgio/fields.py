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


def holds(block: bytes | Path, quote: str) -> bool:
    """Whether a block of lines (or a whole file, read a block at a time) holds the quote."""
    mark = quote.encode("utf-8")
    if isinstance(block, bytes):
        return mark in block
    with block.open("rb") as f:
        return any(mark in chunk for chunk in iter(lambda: f.read(READ_BYTES), b""))
