"""Link prediction by name with a trained checkpoint: the top-k entities for (entity, relation),
the rank of a given triple, and the scores of many triples.

Scores are the model's own (:func:`pbgtrain.model.score_candidates`): the relation's operator
and the config's comparator, global embeddings added and ``max_norm`` applied, exactly as
training and ``pbgtrain eval`` score edges. Static relations score (u, r, v) as c(u, f_r(v)),
whichever side is ranked; dynamic relations rank rhs candidates v' by c(g_r(u), v') and lhs
candidates u' by c(u', h_r(v)), so a triple has two scores: ``score`` (the one that ranks rhs
candidates) and ``lhs_side_score`` (the one that ranks lhs candidates; equal for static ones).

:func:`top_k` ranks every entity of the candidate type, partition by partition and a block of
rows at a time, keeping the best ``k`` across blocks (:func:`pbgio.topk.scan_partitions`, the
scan ``pbgio neighbors`` uses too): memory is one partition, one block of scores and ``k``.
Equal scores rank by (partition, row). With filter edge paths, the candidates that form a known
edge with the query (same relation, in any bucket of those edge paths that holds the query's
partition) are left out, as filtered evaluation leaves them out. :func:`rank_triple` ranks a
triple's rhs among all rhs candidates and its lhs among all lhs candidates as
``pbgtrain eval --all-entities`` does (ties count against it, the triple's own slot is left
out, filtering optional), over every partition.

Names: entity names come from the names files (:mod:`pbgio.names`), relation names from the
config (static) or ``dynamic_rel_names.json`` (dynamic). An unknown name raises
:class:`pbgio.errors.UnknownNameError`. Featurized types (bags of features) have no names to
look up nor table to rank, and are refused.

Why this module is long: it is the library of one command with three modes (top-k, the rank of
a triple, a file of triples), their names, filters and output forms; the scan itself is shared
(:func:`pbgio.topk.scan_partitions`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import torch

from pbgio import storage
from pbgio.checkpoint import CheckpointDir, read_committed
from pbgio.edges import read_bucket
from pbgio.errors import InputError, PbgioError, UnknownNameError
from pbgio.importers.fields import WHITESPACE, default_quote, split_fields
from pbgio.names import Position, locate_entities, locate_relations, names_of
from pbgio.spec import naming
from pbgio.storage import AnyPath
from pbgio.topk import (
    BlockScores,
    PartitionScan,
    RankedEntity,
    TopK,
    finite_or_none,
    rows_per_block,
    scan_partitions,
    text_table,
)
from pbgtrain.config import RunConfig, load_run_config
from pbgtrain.evaluate import CheckpointReader
from pbgtrain.model import EntityTable, candidate_space_query, score_candidates
from pbgtrain.training.buckets import PartitionLayout, all_buckets
from pbgtrain.training.device import resolve_device

if TYPE_CHECKING:
    from pbgio.index import EmbeddingIndex

Side = Literal["lhs", "rhs"]
ROW_BUDGET = 1 << 24
"""Candidate rows × dimension scored at once (a block: 64 MiB of float32 per copy)."""
MAX_BLOCK_ROWS = 1 << 16
TRIPLE_BATCH = 1 << 16
"""Triples scored at once by :func:`score_triples`."""


class PredictError(PbgioError, ValueError):
    """A prediction that cannot be made: a featurized type, both or neither side given, a bad k."""


class Triple(NamedTuple):
    """A triple of names; ``where`` locates it in its input (``file:line``) for error messages."""

    lhs: str
    rel: str
    rhs: str
    where: str = ""


# --------------------------------------------------------------------------- results


def _short(value: float) -> str:
    """The shortest decimal that reads back as the same float32 (scores are float32).

    >>> _short(-0.0003174096345901489), _short(2.5)
    ('-0.00031740963', '2.5')
    """
    return str(np.float32(value))


Prediction = RankedEntity
"""One ranked candidate: rank (from 1), name, score and place (partition, row offset)."""


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

    def describe(self) -> str:
        """One line: what was ranked, against what, how, from which checkpoint version."""
        lhs = self.query.get("lhs", "?")
        rhs = self.query.get("rhs", "?")
        filtered = (f"; {self.excluded:,} known edges of {', '.join(self.filter_paths)} left out"
                    if self.filter_paths else "")
        how = "" if self.searched == "exact" else f"; searched: {self.searched}"
        return (f"top {len(self.predictions)} {self.side} candidates for ({lhs}, {self.query['rel']}, {rhs}) among "
                f"{self.candidates:,} {self.entity_type!r} entities{filtered}{how}; checkpoint version {self.version}")

    def format(self) -> str:
        """The table: rank, name, score."""
        return text_table(["rank", "name", "score"],
                          [[str(p.rank), p.name, f"{p.score:.6g}"] for p in self.predictions], right=[0, 2])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (a non-finite score is null)."""
        return {"version": self.version, "side": self.side, "entity_type": self.entity_type, "query": self.query,
                "candidates": self.candidates, "excluded": self.excluded, "filter_paths": self.filter_paths,
                "searched": self.searched, "predictions": [p.to_dict() for p in self.predictions]}


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
        rows = [["rhs", str(self.rhs_rank), str(self.rhs_out_of), f"{self.score:.6g}"],
                ["lhs", str(self.lhs_rank), str(self.lhs_out_of), f"{self.lhs_side_score:.6g}"]]
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
        """TSV with a header (:meth:`columns`), one triple per line."""
        lines = ["\t".join(self.columns())]
        for t in self.scores:
            extra = f"\t{_short(t.lhs_side_score)}" if self.dynamic else ""
            lines.append(f"{t.lhs}\t{t.rel}\t{t.rhs}\t{_short(t.score)}{extra}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "triples": [
            {"lhs": t.lhs, "rel": t.rel, "rhs": t.rhs, "score": finite_or_none(t.score),
             "lhs_side_score": finite_or_none(t.lhs_side_score)} for t in self.scores]}


# --------------------------------------------------------------------------- public API


def top_k(
    config: RunConfig | str | AnyPath,
    *,
    rel: str,
    lhs: str | None = None,
    rhs: str | None = None,
    k: int = 10,
    filter_paths: Sequence[str | AnyPath] = (),
    version: int | None = None,
    device: str | None = None,
    index: bool = False,
    nprobe: int | None = None,
    candidates: int | None = None,
) -> Ranking:
    """The ``k`` best rhs entities for (``lhs``, ``rel``), or the best lhs for (``rel``, ``rhs``).

    Give exactly one of ``lhs`` and ``rhs``. Every entity of the other side's type is scored
    (all partitions); with ``filter_paths``, those forming a known edge with the query are left
    out. Without ``version``, the committed version, read whole even while ``pbgtrain fit``
    commits newer ones. ``device``: as ``pbgtrain eval --device`` (default: the config's).
    With ``index``, the candidate type's index proposes ``candidates`` rows, scored exactly
    (see :class:`Predictor`).
    """
    _check_query(lhs, rhs, k)
    run = _run(config)

    def rank(version: int) -> Ranking:
        with Predictor(run, version=version, device=device, index=index, nprobe=nprobe,
                       candidates=candidates) as predictor:
            return predictor.top_k(rel=rel, lhs=lhs, rhs=rhs, k=k, filter_paths=filter_paths)

    return read_committed(CheckpointDir(run.checkpoint_path), rank, version)


class Predictor:
    """One checkpoint version loaded once to answer many top-k queries: the model, and with
    ``index`` each candidate type's nearest-neighbour index (loaded at its first query).

    With an index, the query is moved into the candidate space through the relation's operator
    (:func:`pbgtrain.model.candidate_space_query`), the index proposes ``candidates`` rows
    (plus the known edges to leave out), and those rows are scored exactly with the model's own
    scoring: every score returned is the model's. Where the comparator allows no such query (l2,
    squared_l2, a bias, cos after an operator on the candidate side) or the index compares by
    another metric, every candidate is scored instead and :attr:`Ranking.searched` says why.
    Without ``version``, the committed one; a Predictor keeps the version it opened.
    """

    def __init__(self, config: RunConfig | str | AnyPath, *, version: int | None = None, device: str | None = None,
                 index: bool = False, nprobe: int | None = None, candidates: int | None = None) -> None:
        if candidates is not None and candidates < 1:
            raise PredictError(f"expected candidates >= 1, found {candidates}")
        self.run = _run(config)
        ckpt = CheckpointDir(self.run.checkpoint_path)
        self.reader = _reader(self.run, ckpt.read_version() if version is None else version, device)
        self.use_index = index
        self.nprobe = nprobe
        self.candidates = candidates
        self._indexes: dict[str, EmbeddingIndex] = {}

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for loaded in self._indexes.values():
            loaded.close()
        self._indexes.clear()

    def top_k(self, *, rel: str, lhs: str | None = None, rhs: str | None = None, k: int = 10,
              filter_paths: Sequence[str | AnyPath] = ()) -> Ranking:
        """As :func:`top_k`, from this Predictor's version."""
        _check_query(lhs, rhs, k)
        run, reader = self.run, self.reader
        side: Side = "rhs" if lhs is not None else "lhs"
        query_name = lhs if lhs is not None else rhs
        assert query_name is not None
        relation = _Relation.find(run, rel)
        query_type, cand_type = relation.types(side)
        query = locate_entities(run.entity_path, query_type, run.config.num_partitions(query_type), [query_name])[
            query_name]
        filters = [storage.resolve(p) for p in filter_paths]
        known = _known_candidates(run, filters, relation.rel_id, side, query_type, query, cand_type)
        query_row = _rows(reader, query_type, [query])
        rel_arg = relation.model_rel(reader.device)
        found = self._indexed(rel_arg, side, query_type, cand_type, query_row, known, k) if self.use_index else None
        if isinstance(found, _Indexed):
            best, total, excluded, searched = found.best, found.candidates, found.excluded, found.searched
        else:
            scan = _scan(reader, rel_arg, side, cand_type, query_row, known, k)
            best, total, excluded = scan.tops[0].items(), scan.candidates, scan.excluded
            searched = "exact" if found is None else f"exact ({found})"
        names = names_of(run.entity_path, cand_type, [Position(p, o) for _, p, o in best])
        predictions = [Prediction(i, names[Position(p, o)], s, p, o) for i, (s, p, o) in enumerate(best, 1)]
        asked = {"lhs": query_name, "rel": rel} if side == "rhs" else {"rel": rel, "rhs": query_name}
        return Ranking(reader.version, side, cand_type, asked, total, excluded,
                       [storage.display(p) for p in filters], predictions, searched)

    def _index(self, entity_type: str) -> EmbeddingIndex:
        if entity_type not in self._indexes:
            from pbgio.exporters.common import ExportSource
            from pbgio.index.search import load_index

            source = ExportSource(self.run.config, self.run.entity_path, self.reader.dir, self.reader.version)
            self._indexes[entity_type] = load_index(source, entity_type, nprobe=self.nprobe)
        return self._indexes[entity_type]

    @torch.no_grad()
    def _indexed(self, rel: int | torch.Tensor, side: Side, query_type: str, cand_type: str, query_row: torch.Tensor,
                 known: dict[int, np.ndarray], k: int) -> _Indexed | str:
        """The best ``k`` through the index, or why the index cannot rank these candidates."""
        from pbgio.index.search import DEFAULT_CANDIDATES

        reader, model, device = self.reader, self.reader.model, self.reader.device
        loaded = self._index(cand_type)
        query_table = EntityTable(query_row.clone(), entity_type=query_type)
        probe_table = EntityTable(torch.zeros(1, loaded.meta.dimension, device=device), entity_type=cand_type)
        zero = torch.zeros(1, dtype=torch.long, device=device)
        lhs_t, rhs_t = (query_table, probe_table) if side == "rhs" else (probe_table, query_table)
        mapped = candidate_space_query(model, lhs_t, rhs_t, zero, rel, zero, side)
        if isinstance(mapped, str):
            return mapped
        vector, metric = mapped
        if metric != loaded.metric:
            return (f"the model ranks {cand_type!r} candidates by {metric}, the index by {loaded.metric}: build a "
                    f"{metric} index with pbgio index build --metric {metric}")
        num_known = sum(len(rows) for rows in known.values())
        want = max(k, self.candidates or DEFAULT_CANDIDATES) + num_known
        parts, offsets = loaded.propose(vector.float().cpu().numpy()[None], want)
        keep = parts[0] >= 0
        for part, rows in known.items():
            keep &= ~((parts[0] == part) & np.isin(offsets[0], rows))
        parts, offsets = parts[0][keep], offsets[0][keep]
        best = TopK(k)
        for part in np.unique(parts):
            mine = offsets[parts == part]
            weights = reader.dir.read_embedding_rows(cand_type, int(part), reader.version, mine)
            table = EntityTable(torch.from_numpy(weights).to(device), entity_type=cand_type, partition=int(part))
            lhs_t, rhs_t = (query_table, table) if side == "rhs" else (table, query_table)
            cand = torch.arange(len(mine), device=device)
            lhs_ids, rhs_ids = (zero, cand[:1]) if side == "rhs" else (cand[:1], zero)
            _, block = score_candidates(model, lhs_t, rhs_t, lhs_ids, rel, rhs_ids, side, cand)
            best.add(block.float().cpu().numpy()[0], int(part), mine)
        return _Indexed(best.items(), loaded.meta.rows - num_known, num_known,
                        f"{loaded.describe()}, {want:,} candidates scored exactly")


@dataclass(frozen=True)
class _Indexed:
    best: list[tuple[float, int, int]]
    candidates: int
    excluded: int
    searched: str


def _check_query(lhs: str | None, rhs: str | None, k: int) -> None:
    if (lhs is None) == (rhs is None):
        raise PredictError("give exactly one of lhs and rhs: the other side is ranked (rank_triple ranks a "
                           "whole triple)")
    if k < 1:
        raise PredictError(f"expected k >= 1, found {k}")


def rank_triple(
    config: RunConfig | str | AnyPath,
    lhs: str,
    rel: str,
    rhs: str,
    *,
    filter_paths: Sequence[str | AnyPath] = (),
    version: int | None = None,
    device: str | None = None,
) -> TripleRank:
    """The scores of (``lhs``, ``rel``, ``rhs``) and its ranks: the rhs among every entity of the
    rhs type, the lhs among every entity of the lhs type (``rank = 1 + #candidates scoring at
    least as high``, the triple's own slot left out; filtered like :func:`top_k`)."""
    run = _run(config)
    relation = _Relation.find(run, rel)
    cfg = run.config
    lhs_pos = locate_entities(run.entity_path, relation.lhs, cfg.num_partitions(relation.lhs), [lhs])[lhs]
    rhs_pos = locate_entities(run.entity_path, relation.rhs, cfg.num_partitions(relation.rhs), [rhs])[rhs]
    filters = [storage.resolve(p) for p in filter_paths]

    def rank(version: int) -> TripleRank:
        reader = _reader(run, version, device)
        rel_arg = relation.model_rel(reader.device)
        u = _rows(reader, relation.lhs, [lhs_pos])
        v = _rows(reader, relation.rhs, [rhs_pos])
        positives = _pair_scores(reader, relation, rel_arg, u, v)
        ranks = {}
        sides: tuple[tuple[Side, Position, torch.Tensor, Position], ...] = (("rhs", lhs_pos, u, rhs_pos),
                                                                           ("lhs", rhs_pos, v, lhs_pos))
        for side, query, query_row, target in sides:
            query_type, cand_type = relation.types(side)
            known = _known_candidates(run, filters, relation.rel_id, side, query_type, query, cand_type)
            positive = float(positives[side][0])
            scan = _scan(reader, rel_arg, side, cand_type, query_row, known, None, positive, target)
            worst = scan.candidates + 1
            ranks[side] = (worst if math.isnan(positive) else scan.at_least[0] + 1, worst)
        return TripleRank(reader.version, lhs, rel, rhs, float(positives["rhs"][0]), float(positives["lhs"][0]),
                          *ranks["rhs"], *ranks["lhs"], [storage.display(p) for p in filters])

    return read_committed(CheckpointDir(run.checkpoint_path), rank, version)


def score_triples(
    config: RunConfig | str | AnyPath,
    triples: Iterable[Triple | Sequence[str]],
    *,
    version: int | None = None,
    device: str | None = None,
) -> ScoredTriples:
    """The model's scores of (lhs, rel, rhs) name triples, in order.

    Names are resolved first (an unknown one raises :class:`~pbgio.errors.UnknownNameError`
    naming the triple); then each partition holding a needed entity is read once, and the
    triples are scored in batches of :data:`TRIPLE_BATCH`.
    """
    run = _run(config)
    items = [_as_triple(t, i) for i, t in enumerate(triples)]
    cfg = run.config
    try:
        rel_ids = locate_relations(cfg, run.entity_path, [t.rel for t in items])
    except UnknownNameError as exc:
        raise _in_triple(exc, next(t for t in items if t.rel == exc.names[0])) from None
    relations = {name: _Relation.of(run, name, rel_id) for name, rel_id in rel_ids.items()}
    wanted: dict[str, list[str]] = {}  # entity type -> names
    for t in items:
        relation = relations[t.rel]
        wanted.setdefault(relation.lhs, []).append(t.lhs)
        wanted.setdefault(relation.rhs, []).append(t.rhs)
    positions: dict[str, dict[str, Position]] = {}
    for etype, names in wanted.items():
        try:
            positions[etype] = locate_entities(run.entity_path, etype, cfg.num_partitions(etype), names)
        except UnknownNameError as exc:
            first = next(t for t in items if (t.lhs == exc.names[0] and relations[t.rel].lhs == etype)
                         or (t.rhs == exc.names[0] and relations[t.rel].rhs == etype))
            raise _in_triple(exc, first) from None

    def score(version: int) -> ScoredTriples:
        reader = _reader(run, version, device)
        tables = {etype: EntityTable(_rows(reader, etype, list(found.values())), entity_type=etype)
                  for etype, found in positions.items()}
        rows = {etype: {name: i for i, name in enumerate(found)} for etype, found in positions.items()}
        out: list[TripleScore | None] = [None] * len(items)
        groups: dict[int, list[int]] = {}
        for i, t in enumerate(items):  # static relations: one relation per batch; dynamic: mixed
            groups.setdefault(0 if cfg.dynamic_relations else relations[t.rel].rel_id, []).append(i)
        for members in groups.values():
            for start in range(0, len(members), TRIPLE_BATCH):
                batch = [items[i] for i in members[start:start + TRIPLE_BATCH]]
                relation = relations[batch[0].rel]
                lhs_t, rhs_t = tables[relation.lhs], tables[relation.rhs]
                u = torch.tensor([rows[relation.lhs][t.lhs] for t in batch], device=reader.device)
                v = torch.tensor([rows[relation.rhs][t.rhs] for t in batch], device=reader.device)
                rel_arg: int | torch.Tensor = (
                    torch.tensor([relations[t.rel].rel_id for t in batch], device=reader.device)
                    if cfg.dynamic_relations else relation.rel_id)
                pos = _pair_scores_ids(reader, lhs_t, rhs_t, u, rel_arg, v)
                for j, (i, t) in enumerate(zip(members[start:start + TRIPLE_BATCH], batch, strict=True)):
                    out[i] = TripleScore(t.lhs, t.rel, t.rhs, float(pos["rhs"][j]), float(pos["lhs"][j]))
        return ScoredTriples(reader.version, cfg.dynamic_relations, [s for s in out if s is not None])

    return read_committed(CheckpointDir(run.checkpoint_path), score, version)


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
    for number, line, fields, shown in _delimited_lines(text, delimiter, quote):
        if fields is None:
            raise InputError(source, number, f"expected each quoted field to end with {_quote(delimiter, quote)} "
                                             f"followed by {shown} or the end of the line, found {line[:80]!r}")
        if len(fields) != 3 or not all(fields):
            raise InputError(source, number, f"expected 3 non-empty fields lhs, rel, rhs separated by {shown}, "
                                             f"found {len(fields)} field(s): {line[:80]!r}")
        triples.append(Triple(fields[0], fields[1], fields[2], f"{source}:{number}"))
    return triples


def _quote(delimiter: str, quote: str | None) -> str | None:
    return default_quote(delimiter) if quote == "auto" else quote


def _delimited_lines(text: str, delimiter: str, quote: str | None) -> Iterator[tuple[int, str, list[str] | None, str]]:
    """``(line number, line, its fields or None when its quoting is malformed, how the delimiter is
    named)`` of each non-blank line, split as ``pbgio import`` splits."""
    quote = _quote(delimiter, quote)
    shown = "whitespace" if delimiter == WHITESPACE else repr(delimiter)
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield number, line, split_fields(line, delimiter, quote), shown


class Query(NamedTuple):
    """A top-k query: exactly one of ``lhs`` and ``rhs`` is None (the side ranked)."""

    lhs: str | None
    rel: str
    rhs: str | None
    where: str = ""


def parse_queries(text: str, source: str = "<queries>", delimiter: str = "\t",
                  quote: str | None = "auto") -> list[Query]:
    """Top-k queries from delimited text (split as :func:`parse_triples` splits): ``lhs, rel,``
    (an empty rhs) ranks rhs candidates, ``, rel, rhs`` lhs ones (blank lines skipped).

    >>> parse_queries("ann\\tlikes\\t\\n\\tlikes\\tbob\\n", "q.tsv")[1]
    Query(lhs=None, rel='likes', rhs='bob', where='q.tsv:2')
    >>> parse_queries('"alga, red",causes,\\n', "q.csv", ",")[0][:3]
    ('alga, red', 'causes', None)
    """
    queries = []
    for number, line, fields, shown in _delimited_lines(text, delimiter, quote):
        if fields is None or len(fields) != 3 or not fields[1] or bool(fields[0]) == bool(fields[2]):
            raise InputError(source, number, f"expected lhs, rel and an empty rhs (rank rhs candidates) or an empty "
                                             f"lhs, rel and rhs (rank lhs candidates), separated by {shown}, found "
                                             f"{line[:80]!r}")
        queries.append(Query(fields[0] or None, fields[1], fields[2] or None, f"{source}:{number}"))
    return queries


def read_queries(path: str | Path, delimiter: str = "\t", quote: str | None = "auto") -> list[Query]:
    """The top-k queries of a UTF-8 text file, a path or URL (:func:`parse_queries`)."""
    return parse_queries(_read_text(path, "queries file"), str(path), delimiter, quote)


def format_rankings(rankings: Sequence[Ranking]) -> str:
    """TSV with a header: the query (the ranked side empty), then rank, name, score per candidate."""
    lines = ["lhs\trel\trhs\trank\tname\tscore"]
    for r in rankings:
        query = f"{r.query.get('lhs', '')}\t{r.query['rel']}\t{r.query.get('rhs', '')}"
        lines += [f"{query}\t{p.rank}\t{p.name}\t{_short(p.score)}" for p in r.predictions]
    return "\n".join(lines)


def read_triples(path: str | Path, delimiter: str = "\t", quote: str | None = "auto") -> list[Triple]:
    """The triples of a UTF-8 text file, a path or URL (:func:`parse_triples`); a missing file is a
    :class:`~pbgio.errors.MissingArtifactError`, bytes that are not UTF-8 an :class:`InputError`."""
    return parse_triples(_read_text(path, "triples file"), str(path), delimiter, quote)


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


# --------------------------------------------------------------------------- internals


@dataclass(frozen=True)
class _Relation:
    """A relation by name: its id (static index or dynamic id) and its entity types."""

    name: str
    rel_id: int
    lhs: str
    rhs: str
    dynamic: bool

    @classmethod
    def find(cls, run: RunConfig, name: str) -> _Relation:
        return cls.of(run, name, locate_relations(run.config, run.entity_path, [name])[name])

    @classmethod
    def of(cls, run: RunConfig, name: str, rel_id: int) -> _Relation:
        cfg = run.config
        schema = cfg.relations[0 if cfg.dynamic_relations else rel_id]
        for side in ("lhs", "rhs"):
            etype = getattr(schema, side)
            if cfg.entities[etype].featurized:
                raise PredictError(f"relation {name!r}: its {side} type {etype!r} is featurized: its entities are "
                                   "bags of features, with no names to look up and no table to rank (pbgio embed "
                                   "embeds bags)")
        return cls(name, rel_id, schema.lhs, schema.rhs, cfg.dynamic_relations)

    def types(self, side: Side) -> tuple[str, str]:
        """(query type, candidate type) when ranking ``side``."""
        return (self.lhs, self.rhs) if side == "rhs" else (self.rhs, self.lhs)

    def model_rel(self, device: torch.device) -> int | torch.Tensor:
        """The relation as the model takes it for one edge: an index, or a [1] tensor of the dynamic id."""
        return torch.tensor([self.rel_id], device=device) if self.dynamic else self.rel_id


def _run(config: RunConfig | str | AnyPath) -> RunConfig:
    return config if isinstance(config, RunConfig) else load_run_config(config)


def _as_triple(value: Triple | Sequence[str], index: int) -> Triple:
    if isinstance(value, Triple):
        return value if value.where else value._replace(where=f"triple {index + 1}")
    parts = list(value)
    if len(parts) != 3 or not all(isinstance(p, str) for p in parts):
        raise PredictError(f"triple {index + 1}: expected (lhs, rel, rhs) names, found {value!r}")
    return Triple(parts[0], parts[1], parts[2], f"triple {index + 1}")


def _in_triple(exc: UnknownNameError, triple: Triple) -> UnknownNameError:
    return UnknownNameError(exc.names, exc.what, exc.where, context=triple.where, hint=exc.hint)


def _reader(run: RunConfig, version: int, device: str | None) -> CheckpointReader:
    return CheckpointReader(run, version, resolve_device(device, run))


def _rows(reader: CheckpointReader, entity_type: str, positions: Sequence[Position]) -> torch.Tensor:
    """The stored rows of ``positions`` ([len, D], on the reader's device), each partition read once."""
    dim = reader.run.config.entity_dimension(entity_type)
    out = torch.empty(len(positions), dim)
    by_part: dict[int, list[int]] = {}
    for i, pos in enumerate(positions):
        by_part.setdefault(pos.partition, []).append(i)
    for part, members in sorted(by_part.items()):
        weights = reader.dir.read_embeddings(entity_type, part, reader.version).embeddings
        offsets = [positions[i].offset for i in members]
        if max(offsets) >= len(weights):
            path = reader.run.entity_path / naming.entity_names_file(entity_type, part)
            raise PredictError(f"{path}: expected {len(weights)} names (the rows of "
                               f"{reader.dir.embeddings_path(entity_type, part, reader.version)}), found more "
                               "[entity-names-count]")
        out[members] = torch.from_numpy(weights[offsets])
    return out.to(reader.device)


def _known_candidates(run: RunConfig, filter_paths: list[AnyPath], rel_id: int, side: Side, query_type: str,
                      query: Position, cand_type: str) -> dict[int, np.ndarray]:
    """Rows of each candidate partition that form a known edge (relation ``rel_id``) with the query
    in the filter edge paths: every bucket holding the query's partition on its side is read."""
    if not filter_paths:
        return {}
    layout = PartitionLayout.from_config(run.config)
    query_side: Side = "lhs" if side == "rhs" else "rhs"
    found: dict[int, list[np.ndarray]] = {}
    for directory in filter_paths:
        for bucket in all_buckets(*run.config.bucket_grid()):
            if layout.partition_of(query_type, bucket, query_side) != query.partition:
                continue
            edges = read_bucket(directory / naming.bucket_file(bucket.lhs, bucket.rhs))
            query_ids, cand_ids = (edges.lhs, edges.rhs) if side == "rhs" else (edges.rhs, edges.lhs)
            hits = cand_ids[(edges.rel == rel_id) & (query_ids == query.offset)]
            if len(hits):
                found.setdefault(layout.partition_of(cand_type, bucket, side), []).append(hits)
    return {part: np.unique(np.concatenate(ids)) for part, ids in found.items()}


@torch.no_grad()
def _scan(reader: CheckpointReader, rel: int | torch.Tensor, side: Side, cand_type: str, query_row: torch.Tensor,
          known: dict[int, np.ndarray], k: int | None, positive: float | None = None,
          target: Position | None = None) -> PartitionScan:
    """Score the query (one row, of the other side's type) against every entity of ``cand_type``,
    partition by partition and block by block (:func:`pbgio.topk.scan_partitions`); keep the best
    ``k`` and count the candidates scoring at least ``positive``. Known edges and the ``target``'s
    own slot are left out."""
    model = reader.model
    device = reader.device
    query_type = model.relation(rel).lhs if side == "rhs" else model.relation(rel).rhs
    query_table = EntityTable(query_row.clone(), entity_type=query_type)
    zero = torch.zeros(1, dtype=torch.long, device=device)

    def open_partition(part: int) -> tuple[int, BlockScores]:
        weights = reader.dir.read_embeddings(cand_type, part, reader.version).embeddings
        table = EntityTable(torch.from_numpy(weights).to(device), entity_type=cand_type, partition=part)
        lhs_table, rhs_table = (query_table, table) if side == "rhs" else (table, query_table)

        def scores(start: int, stop: int) -> np.ndarray:
            cand = torch.arange(start, stop, device=device)
            lhs_ids, rhs_ids = (zero, cand[:1]) if side == "rhs" else (cand[:1], zero)
            _, block = score_candidates(model, lhs_table, rhs_table, lhs_ids, rel, rhs_ids, side, cand)
            return block.float().cpu().numpy()

        return table.num_entities, scores

    step = rows_per_block(reader.run.config.entity_dimension(cand_type), ROW_BUDGET, MAX_BLOCK_ROWS)
    return scan_partitions(range(reader.run.config.num_partitions(cand_type)), open_partition, k=k,
                           block_rows=step, exclude=known,
                           skip=(target.partition, target.offset) if target is not None else None,
                           at_least=[positive] if positive is not None else None)


@torch.no_grad()
def _pair_scores(reader: CheckpointReader, relation: _Relation, rel: int | torch.Tensor, u: torch.Tensor,
                 v: torch.Tensor) -> dict[str, torch.Tensor]:
    """Both sides' positive scores of edges between rows ``u`` and ``v`` ([B, D] each)."""
    lhs_t = EntityTable(u.clone(), entity_type=relation.lhs)
    rhs_t = EntityTable(v.clone(), entity_type=relation.rhs)
    ids = torch.arange(len(u), device=reader.device)
    return _pair_scores_ids(reader, lhs_t, rhs_t, ids, rel, ids)


@torch.no_grad()
def _pair_scores_ids(reader: CheckpointReader, lhs_t: EntityTable, rhs_t: EntityTable, u: torch.Tensor,
                     rel: int | torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{"rhs": scores ranking rhs candidates, "lhs": scores ranking lhs candidates}`` of edges
    (u[i], rel, v[i]) of the tables, on the CPU."""
    out = {}
    for side, own in (("rhs", v), ("lhs", u)):
        pos, _ = score_candidates(reader.model, lhs_t, rhs_t, u, rel, v, side, own.unsqueeze(1))
        out[side] = pos.float().cpu()
    return out
