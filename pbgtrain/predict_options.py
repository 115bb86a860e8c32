"""Which of ``pbgtrain predict``'s options go together: the usage errors (exit 2) of a command line,
checked before anything is read. Light on imports (no torch), as the command line's checks are.

>>> usage_problem(PredictChoices(lhs="a", rhs="b", rel="r", index=True))
'--index applies to top-k queries (--lhs or --rhs, or --queries), not to scoring triples'
>>> usage_problem(PredictChoices(lhs="a", rel="r", proposals=50))
'--proposals applies to --index searches'
>>> usage_problem(PredictChoices(lhs="a", rel="r")) is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PredictChoices:
    """The options of one ``predict`` command line that decide what it does (None: not given)."""

    lhs: str | None = None
    rhs: str | None = None
    rel: str | None = None
    lhs_features: str | None = None
    rhs_features: str | None = None
    triples: str | None = None
    queries: str | None = None
    filtered: bool = False
    feature_separator: str = ""
    unknown: Any = None
    index: bool = False
    nprobe: int | None = None
    proposals: int | None = None
    candidates: bool = False
    candidates_file: bool = False


def usage_problem(c: PredictChoices) -> str | None:
    """The first thing wrong with ``c`` as a command line (a usage error's message), or None."""
    triple = c.triples is not None or (c.lhs is not None and c.rhs is not None)
    index_only = [name for name, value in (("--nprobe", c.nprobe), ("--proposals", c.proposals)) if value is not None]
    filtering = [name for name, given in (("--candidates", c.candidates), ("--candidates-file", c.candidates_file))
                 if given]
    checks = [
        _bag_problem(c),
        "--triples scores the triples of a file: give it without --lhs, --rel, --rhs and --filter"
        if c.triples is not None and (c.lhs is not None or c.rel is not None or c.rhs is not None or c.filtered)
        else None,
        "--queries answers the top-k queries of a file: give it without --lhs, --rel, --rhs and --triples"
        if c.queries is not None and (c.lhs is not None or c.rel is not None or c.rhs is not None
                                      or c.triples is not None) else None,
        f"{_and(index_only)} to --index searches" if index_only and not c.index else None,
        f"{_and(filtering)} to top-k queries (--lhs or --rhs, or --queries), not to scoring triples"
        if filtering and triple else None,
        "--index applies to top-k queries (--lhs or --rhs, or --queries), not to scoring triples"
        if c.index and triple else None,
    ]
    return next((problem for problem in checks if problem), None)


def _and(options: list[str]) -> str:
    return f"{' and '.join(options)} appl{'y' if len(options) > 1 else 'ies'}"


def _bag_problem(c: PredictChoices) -> str | None:
    given = [name for name, value in (("--lhs-features", c.lhs_features), ("--rhs-features", c.rhs_features))
             if value is not None]
    others = [name for name, value in (("--lhs", c.lhs), ("--rhs", c.rhs), ("--triples", c.triples),
                                       ("--queries", c.queries)) if value is not None]
    if not given and (c.unknown is not None or c.feature_separator) and c.queries is None:
        return ("--unknown and --feature-separator apply to bags of features: --lhs-features, --rhs-features, or a "
                "featurized field of --queries")
    if len(given) == 2:
        return "give one of --lhs-features and --rhs-features: the other side is ranked"
    if given and others:
        return f"{given[0]} is the query of a top-k: give it without {' and '.join(others)}"
    return f"{given[0]}: give the relation with --rel" if given and c.rel is None else None
