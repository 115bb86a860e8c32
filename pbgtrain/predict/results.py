"""What ``pbgtrain predict`` answers, and how it is printed: a top-k :class:`Ranking`, the ranks of a
triple (:class:`TripleRank`), the scores of triples (:class:`ScoredTriples`); each formats itself
as a table (or TSV) and as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pbgio.console import printable
from pbgio.errors import PbgioError
from pbgio.topk import RankedEntity, finite_or_none, score_column, text_table

if TYPE_CHECKING:
    from pbgio.candidates import AdmittedRows
    from pbgio.index import Widened

Side = Literal["lhs", "rhs"]


class PredictError(PbgioError, ValueError):
    """A prediction that cannot be made: a featurized type, both or neither side given, a bad k."""


def short_score(value: float) -> str:
    """The shortest decimal that reads back as the same float32 (scores are float32).

    >>> short_score(-0.0003174096345901489), short_score(2.5)
    ('-0.00031740963', '2.5')
    """
    return str(np.float32(value))


Prediction = RankedEntity
"""One ranked candidate: rank (from 1), name, score and place (partition, row offset)."""


@dataclass(frozen=True)
class RankedBag:
    """A featurized query: the bag of features of ``side`` (an ``entity_type`` featurized), the
    ``features`` it was scored with (in the order given) and the unknown ones ``skipped``
    (``unknown="ignore"``)."""

    side: Side
    entity_type: str
    features: list[str]
    skipped: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """What the bag was, for a ranking's line.

        >>> RankedBag("lhs", "doc", ["w1", "w2"], ["blockchain"]).describe()
        "lhs: a bag of 2 'doc' features; unknown features skipped: 'blockchain'"
        """
        skipped = f"; unknown features skipped: {', '.join(map(repr, self.skipped))}" if self.skipped else ""
        return f"{self.side}: a bag of {len(self.features):,} {self.entity_type!r} features{skipped}"

    def to_dict(self) -> dict[str, Any]:
        return {"side": self.side, "entity_type": self.entity_type, "features": self.features,
                "skipped": self.skipped}


@dataclass(frozen=True)
class Ranking:
    """The best candidates of one side for a query (``side`` is the side ranked).

    ``candidates`` counts the entities scored, ``excluded`` those left out as known edges.
    """

    version: int
    side: Side
    entity_type: str
    query: dict[str, str]
    candidates: int
    excluded: int
    filter_paths: list[str]
    predictions: list[Prediction]
    searched: str = "exact"
    """``exact`` (every candidate scored), the index that proposed the candidates (then scored
    exactly), or ``exact (why the index could not be used)``."""
    self_excluded: bool = False  # the query entity was left out of the candidates (``--exclude-self``)
    bag: RankedBag | None = None  # a featurized query: its bag of features (the query holds the bag as given)
    admitted: AdmittedRows | None = None
    """With a candidate filter (``--candidates``): the rows it admits (``candidates`` counts those)."""
    widened: Widened | None = None
    """Through an index: how far it was asked (:meth:`pbgio.index.EmbeddingIndex.propose_passing`)."""

    def shortfall(self) -> str | None:
        """Why fewer than k candidates passed the candidate filter through the index, or None."""
        if self.admitted is None or self.widened is None or self.widened.complete:
            return None
        return self.widened.shortfall(self.widened.need, "candidates")

    def describe(self) -> str:
        """One line: what was ranked, against what, how, from which checkpoint version."""
        lhs = self.query.get("lhs", "?")
        rhs = self.query.get("rhs", "?")
        filtered = (f"; {self.excluded:,} known edges of {', '.join(self.filter_paths)} left out"
                    if self.filter_paths else "")
        how = "" if self.searched == "exact" else f"; searched: {self.searched}"
        if self.self_excluded:
            filtered += f"; {lhs if self.side == 'rhs' else rhs} itself left out"
        if self.bag is not None:
            filtered = f"; {self.bag.describe()}{filtered}"
        among = "" if self.admitted is None else f" ({self.admitted.describe(self.entity_type)})"
        short = self.shortfall()
        how += "" if short is None else f"; {short}"
        return (f"top {len(self.predictions)} {self.side} candidates for ({lhs}, {self.query['rel']}, {rhs}) among "
                f"{self.candidates:,} {self.entity_type!r} entities{among}{filtered}{how}; checkpoint version "
                f"{self.version}")

    def format(self) -> str:
        """The table: rank, name, score."""
        scores = score_column([p.score for p in self.predictions])
        return text_table(["rank", "name", "score"],
                          [[str(p.rank), p.name, score] for p, score in zip(self.predictions, scores, strict=True)],
                          right=[0, 2])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (a non-finite score is null)."""
        return {"version": self.version, "side": self.side, "entity_type": self.entity_type, "query": self.query,
                "candidates": self.candidates, "excluded": self.excluded, "filter_paths": self.filter_paths,
                "searched": self.searched, "self_excluded": self.self_excluded,
                "predictions": [p.to_dict() for p in self.predictions]} | (
                    {} if self.bag is None else {"bag": self.bag.to_dict()}) | self._filtered()

    def _filtered(self) -> dict[str, Any]:
        """With a candidate filter: ``candidate_filter`` and, through an index, ``index_search``."""
        if self.admitted is None:
            return {}
        return {"candidate_filter": self.admitted.to_dict(),
                **({} if self.widened is None else {"index_search": self.widened.to_dict()})}


@dataclass(frozen=True)
class TripleRank:
    """A triple's scores and ranks: its rhs among the rhs candidates, its lhs among the lhs ones.

    ``rhs_out_of`` / ``lhs_out_of`` count the triple itself and the candidates it was ranked
    against (the worst rank).
    """

    version: int
    lhs: str
    rel: str
    rhs: str
    score: float
    lhs_side_score: float
    rhs_rank: int
    rhs_out_of: int
    lhs_rank: int
    lhs_out_of: int
    filter_paths: list[str] = field(default_factory=list)

    def describe(self) -> str:
        filtered = f", filtered against {', '.join(self.filter_paths)}" if self.filter_paths else ""
        return f"({self.lhs}, {self.rel}, {self.rhs}) ranked on both sides{filtered}; checkpoint version {self.version}"

    def format(self) -> str:
        """The table: side ranked, rank, out of, score."""
        rhs_score, lhs_score = score_column([self.score, self.lhs_side_score])
        rows = [["rhs", str(self.rhs_rank), str(self.rhs_out_of), rhs_score],
                ["lhs", str(self.lhs_rank), str(self.lhs_out_of), lhs_score]]
        return text_table(["side", "rank", "out of", "score"], rows, right=[1, 2, 3])

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "lhs": self.lhs, "rel": self.rel, "rhs": self.rhs,
                "score": finite_or_none(self.score), "lhs_side_score": finite_or_none(self.lhs_side_score),
                "rhs_rank": self.rhs_rank, "rhs_out_of": self.rhs_out_of, "lhs_rank": self.lhs_rank,
                "lhs_out_of": self.lhs_out_of, "filter_paths": self.filter_paths}


@dataclass(frozen=True)
class TripleScore:
    """The model's scores of one triple (``lhs_side_score`` differs only with dynamic relations)."""

    lhs: str
    rel: str
    rhs: str
    score: float
    lhs_side_score: float


@dataclass(frozen=True)
class ScoredTriples:
    """The scores of triples, in their input order, from checkpoint ``version``."""

    version: int
    dynamic: bool
    scores: list[TripleScore]

    def columns(self) -> list[str]:
        """The header: ``lhs rel rhs score``, plus ``lhs_side_score`` with dynamic relations."""
        return ["lhs", "rel", "rhs", "score", *(["lhs_side_score"] if self.dynamic else [])]

    def meaning(self) -> str:
        """Which score is which (one line)."""
        if not self.dynamic:
            return "score: the model's score of the triple (static relations score it the same for either side)"
        return ("score: ranks rhs candidates for (lhs, rel), c(g_rel(lhs), rhs); lhs_side_score: ranks lhs "
                "candidates for (rel, rhs), c(lhs, h_rel(rhs)) (dynamic relations score each side with its own "
                "operator)")

    def format(self) -> str:
        """TSV with a header (:meth:`columns`), one triple per line (control characters in names
        escaped: :func:`pbgio.console.printable`)."""
        lines = ["\t".join(self.columns())]
        for t in self.scores:
            extra = f"\t{short_score(t.lhs_side_score)}" if self.dynamic else ""
            lines.append(f"{printable(t.lhs)}\t{printable(t.rel)}\t{printable(t.rhs)}\t{short_score(t.score)}{extra}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "triples": [
            {"lhs": t.lhs, "rel": t.rel, "rhs": t.rhs, "score": finite_or_none(t.score),
             "lhs_side_score": finite_or_none(t.lhs_side_score)} for t in self.scores]}


def format_rankings(rankings: Sequence[Ranking]) -> str:
    """TSV with a header: the query (the ranked side empty), then rank, name, score per candidate
    (control characters in names escaped: :func:`pbgio.console.printable`)."""
    lines = ["lhs\trel\trhs\trank\tname\tscore"]
    for r in rankings:
        query = "\t".join(printable(r.query.get(side, "")) for side in ("lhs", "rel", "rhs"))
        lines += [f"{query}\t{p.rank}\t{printable(p.name)}\t{short_score(p.score)}" for p in r.predictions]
    return "\n".join(lines)

