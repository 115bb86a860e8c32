"""The inputs of ``pbgtrain predict``: triples to score (``--triples``) and top-k queries
(``--queries``), from text split as ``pbgio import`` splits it (:func:`pbgio.fields.delimited_lines`).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from pbgio import storage
from pbgio.errors import InputError
from pbgio.fields import delimited_lines, quote_for


class Triple(NamedTuple):
    """A triple of names; ``where`` locates it in its input (``file:line``) for error messages."""

    lhs: str
    rel: str
    rhs: str
    where: str = ""


class Query(NamedTuple):
    """A top-k query: exactly one of ``lhs`` and ``rhs`` is None (the side ranked)."""

    lhs: str | None
    rel: str
    rhs: str | None
    where: str = ""


def parse_triples(text: str, source: str = "<triples>", delimiter: str = "\t",
                  quote: str | None = "auto") -> list[Triple]:
    """Triples from delimited text: ``lhs rel rhs`` per line, split as ``pbgio import`` splits
    (``delimiter``: one character or ``"whitespace"``; fields quoted with ``quote`` as CSV writers
    quote them, by default for every delimiter but tab; blank lines skipped).

    >>> for triple in parse_triples("ann\\tlikes\\tbob\\n\\ncy\\tfollows\\tann\\r\\n", "t.tsv"):
    ...     print(triple)
    Triple(lhs='ann', rel='likes', rhs='bob', where='t.tsv:1')
    Triple(lhs='cy', rel='follows', rhs='ann', where='t.tsv:3')
    >>> parse_triples('"alga, red",causes,virus\\n', "t.csv", ",")[0][:3]
    ('alga, red', 'causes', 'virus')
    """
    triples = []
    for number, line, fields, shown in delimited_lines(text, delimiter, quote):
        if fields is None:
            raise InputError(source, number, f"expected each quoted field to end with {quote_for(delimiter, quote)} "
                                             f"followed by {shown} or the end of the line, found {line[:80]!r}")
        if len(fields) != 3 or not all(fields):
            raise InputError(source, number, f"expected 3 non-empty fields lhs, rel, rhs separated by {shown}, "
                                             f"found {len(fields)} field(s): {line[:80]!r}")
        triples.append(Triple(fields[0], fields[1], fields[2], f"{source}:{number}"))
    return triples


def read_triples(path: str | Path, delimiter: str = "\t", quote: str | None = "auto") -> list[Triple]:
    """The triples of a UTF-8 text file, a path or URL (:func:`parse_triples`); a missing file is a
    :class:`~pbgio.errors.MissingArtifactError`, bytes that are not UTF-8 an :class:`InputError`."""
    return parse_triples(_read_text(path, "triples file"), str(path), delimiter, quote)


def parse_queries(text: str, source: str = "<queries>", delimiter: str = "\t",
                  quote: str | None = "auto") -> list[Query]:
    """Top-k queries from delimited text (split as :func:`parse_triples` splits): ``lhs, rel,``
    (an empty rhs) ranks rhs candidates, ``, rel, rhs`` lhs ones (blank lines skipped). Where the
    given side's type is featurized, its field is a bag of features, split when the query is
    answered (:meth:`pbgtrain.predict.Predictor.answer`): one bag a line.

    >>> parse_queries("ann\\tlikes\\t\\n\\tlikes\\tbob\\n", "q.tsv")[1]
    Query(lhs=None, rel='likes', rhs='bob', where='q.tsv:2')
    >>> parse_queries('"alga, red",causes,\\n', "q.csv", ",")[0][:3]
    ('alga, red', 'causes', None)
    """
    queries = []
    for number, line, fields, shown in delimited_lines(text, delimiter, quote):
        if fields is None or len(fields) != 3 or not fields[1] or bool(fields[0]) == bool(fields[2]):
            raise InputError(source, number, f"expected lhs, rel and an empty rhs (rank rhs candidates) or an empty "
                                             f"lhs, rel and rhs (rank lhs candidates), separated by {shown}, found "
                                             f"{line[:80]!r}")
        queries.append(Query(fields[0] or None, fields[1], fields[2] or None, f"{source}:{number}"))
    return queries


def read_queries(path: str | Path, delimiter: str = "\t", quote: str | None = "auto") -> list[Query]:
    """The top-k queries of a UTF-8 text file, a path or URL (:func:`parse_queries`)."""
    return parse_queries(_read_text(path, "queries file"), str(path), delimiter, quote)


def _read_text(path: str | Path, what: str) -> str:
    from pbgio.errors import MissingArtifactError

    location = storage.resolve(path)
    try:
        with storage.open_binary(location, what) as source:
            raw = source.read()
    except FileNotFoundError:
        raise MissingArtifactError(str(path), what) from None
    try:
        return str(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(str(path), raw[:exc.start].count(b"\n") + 1, "expected UTF-8 text") from None
