"""The top-k entities of (entity, relation), the ranks of a triple, the scores of many triples:
``pbgtrain predict``'s library (see :mod:`pbgtrain.predict`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from pbgio import storage
from pbgio.candidates import AdmittedRows, CandidateFilter
from pbgio.checkpoint import read_committed
from pbgio.errors import UnknownNameError
from pbgio.layout import CheckpointVersion, Layout, open_checkpoint
from pbgio.names import Position, locate_entities, locate_relations, names_of
from pbgio.storage import AnyPath
from pbgtrain.checkpoint_reader import CheckpointReader
from pbgtrain.model import EntityTable, candidate_space_query
from pbgtrain.predict.featurized import BagRanker, Unknown, split_features
from pbgtrain.predict.final_scores import scored_one_by_one
from pbgtrain.predict.indexed import Indexed, indexed_top_k
from pbgtrain.predict.inputs import Query, Triple
from pbgtrain.predict.results import (
    PredictError,
    Prediction,
    Ranking,
    ScoredTriples,
    Side,
    TripleRank,
    TripleScore,
)
from pbgtrain.predict.scan import Relation, known_candidates, pair_scores, pair_scores_ids, rows, scan
from pbgtrain.training.device import resolve_device

if TYPE_CHECKING:
    from pbgio.index import EmbeddingIndex

TRIPLE_BATCH = 1 << 16
"""Triples scored at once by :func:`score_triples`."""


def top_k(
    config: Layout | CheckpointVersion | str | AnyPath,
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
    exclude_self: bool = False,
    lhs_features: Sequence[str] | None = None,
    rhs_features: Sequence[str] | None = None,
    unknown: Unknown = "error",
    where: str = "",
    candidate_filter: CandidateFilter | None = None,
) -> Ranking:
    """The ``k`` best rhs entities for (``lhs``, ``rel``), or the best lhs for (``rel``, ``rhs``).

    Give exactly one of ``lhs`` and ``rhs``, or, where that side's type is featurized, of
    ``lhs_features`` and ``rhs_features``: a bag of feature names (unknown ones an error, or
    skipped and listed with ``unknown="ignore"``; see :mod:`pbgtrain.predict.featurized`;
    ``where`` names the bag in errors). Every entity of the other side's type is scored
    (all partitions); with ``filter_paths``, those forming a known edge with the query are left
    out (a relative filter path is relative to the config's folder, like its ``edge_paths``, and
    ``./PATH`` to the current directory: :meth:`pbgio.layout.Layout.argument_path`, the rule of every
    command); with ``exclude_self``, the query entity itself (when it is of the candidates' type).
    Without ``version``, the committed version, read whole even while ``pbgtrain fit`` commits
    newer ones. ``device``: as ``pbgtrain eval --device`` (default: the config's).
    With ``index``, the candidate type's index proposes ``candidates`` rows, scored exactly
    (see :class:`Predictor`). With ``candidate_filter``, only the entities whose names pass it
    are candidates (:class:`pbgio.candidates.CandidateFilter`; none passing raises
    :class:`pbgio.candidates.NoCandidatesError`). The ``k`` returned are scored once more each
    alone (:mod:`pbgtrain.predict.final_scores`): the same score, to the bit, with an index or without.
    """
    _check_query(lhs, rhs, k, lhs_features, rhs_features)
    opened = open_checkpoint(config, version=version, model=True)

    def rank(version: int) -> Ranking:
        with Predictor(opened.at(version), device=device, index=index, nprobe=nprobe,
                       candidates=candidates) as predictor:
            return predictor.top_k(rel=rel, lhs=lhs, rhs=rhs, k=k, filter_paths=filter_paths,
                                   candidate_filter=candidate_filter,
                                   exclude_self=exclude_self, lhs_features=lhs_features, rhs_features=rhs_features,
                                   unknown=unknown, where=where)

    return read_committed(opened.checkpoint, rank, version)


class Predictor:
    """One checkpoint version loaded once to answer many top-k queries: the model, and with
    ``index`` each candidate type's nearest-neighbour index by the model's metric (loaded at its
    first query; :func:`pbgio.index.find_index` picks it among the version's indexes).

    With an index, the query is moved into the candidate space through the relation's operator
    (:func:`pbgtrain.model.candidate_space_query`), the index proposes ``candidates`` rows
    (plus the known edges to leave out), and those rows are scored exactly with the model's own
    scoring: every score returned is the model's. Where the comparator allows no such query (l2,
    squared_l2, a bias, cos after an operator on the candidate side) or no index of the version
    compares by the model's metric, every candidate is scored instead and :attr:`Ranking.searched`
    says why.
    ``config`` is a layout (or a config file), or a checkpoint version already opened
    (:meth:`pbgio.layout.Layout.open_checkpoint`); without ``version``, the committed one. A
    Predictor keeps the version it opened, read with the settings it was trained with.
    """

    def __init__(self, config: Layout | CheckpointVersion | str | AnyPath, *, version: int | None = None,
                 device: str | None = None, index: bool = False, nprobe: int | None = None,
                 candidates: int | None = None) -> None:
        if candidates is not None and candidates < 1:
            raise PredictError(f"expected candidates >= 1, found {candidates}")
        self.reader = _reader(open_checkpoint(config, version=version, model=True), device)
        self.layout = self.reader.layout
        self.use_index = index
        self.nprobe = nprobe
        self.candidates = candidates
        self._indexes: dict[tuple[str, str], EmbeddingIndex | str] = {}  # (type, metric): the index, or why none
        self._admitted: dict[tuple[CandidateFilter, str], AdmittedRows] = {}  # (filter, type): its rows, read once
        self._bags = BagRanker(self.reader)  # queries whose fixed side is a bag of features

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for loaded in self._indexes.values():
            if not isinstance(loaded, str):
                loaded.close()
        self._indexes.clear()

    def top_k(self, *, rel: str, lhs: str | None = None, rhs: str | None = None, k: int = 10,
              filter_paths: Sequence[str | AnyPath] = (), exclude_self: bool = False,
              lhs_features: Sequence[str] | None = None, rhs_features: Sequence[str] | None = None,
              unknown: Unknown = "error", where: str = "",
              candidate_filter: CandidateFilter | None = None) -> Ranking:
        """As :func:`top_k`, from this Predictor's version (``where`` names a bag in errors). A bag is
        scored against every candidate, also with an index (said by :attr:`Ranking.searched`)."""
        _check_query(lhs, rhs, k, lhs_features, rhs_features)
        if lhs_features is not None or rhs_features is not None:
            side: Side = "lhs" if lhs_features is not None else "rhs"
            bag = self._bags.top_k(rel=rel, side=side, features=lhs_features or rhs_features or [], k=k,
                                   filter_paths=filter_paths, unknown=unknown, where=where,
                                   admit=None if candidate_filter is None else
                                   lambda etype: self._admitted_rows(candidate_filter, etype))
            return bag if not self.use_index else replace(
                bag, searched="exact (the index ranks named queries; a bag of features is scored against every "
                              "candidate)")
        layout, reader = self.layout, self.reader
        side = "rhs" if lhs is not None else "lhs"
        query_name = lhs if lhs is not None else rhs
        assert query_name is not None
        relation = Relation.find(layout, rel)
        query_type, cand_type = relation.types(side)
        query = locate_entities(layout.entity_path, query_type, layout.config.num_partitions(query_type),
                                [query_name])[query_name]
        admitted = None if candidate_filter is None else self._admitted_rows(candidate_filter, cand_type)
        filters = [layout.argument_path(str(p)) for p in filter_paths]
        known = known_candidates(layout, filters, relation.rel_id, side, query_type, query, cand_type)
        self_excluded = exclude_self and query_type == cand_type
        already = known.get(query.partition, np.empty(0, np.int64))
        added_self = self_excluded and query.offset not in already  # not a known edge (a self-loop) already
        if added_self:
            known[query.partition] = np.union1d(already, [query.offset])
        counted_self = added_self and (admitted is None or admitted.admits_position(query))  # among the excluded
        query_row = rows(reader, query_type, [query])
        rel_arg = relation.model_rel(reader.device)
        found = (self._indexed(rel_arg, side, query_type, cand_type, query_row, known, k, admitted)
                 if self.use_index else None)
        if isinstance(found, Indexed):
            best, total, excluded, searched = found.best, found.candidates, found.excluded, found.searched
        else:
            scanned = scan(reader, rel_arg, side, cand_type, query_row, known, k, admitted=admitted)
            best, total, excluded = scanned.tops[0].items(), scanned.candidates, scanned.excluded
            searched = "exact" if found is None else f"exact ({found})"
        best = scored_one_by_one(reader, rel_arg, side, query_type, cand_type, query_row, best)
        names = names_of(layout.entity_path, cand_type, [Position(p, o) for _, p, o in best])
        predictions = [Prediction(i, names[Position(p, o)], s, p, o) for i, (s, p, o) in enumerate(best, 1)]
        asked = {"lhs": query_name, "rel": rel} if side == "rhs" else {"rel": rel, "rhs": query_name}
        return Ranking(reader.version, side, cand_type, asked, total, excluded - counted_self,
                       [storage.display(p) for p in filters], predictions, searched, self_excluded,
                       admitted=admitted, widened=found.widened if isinstance(found, Indexed) else None)

    def _admitted_rows(self, candidate_filter: CandidateFilter, entity_type: str) -> AdmittedRows:
        """The rows of ``entity_type`` that ``candidate_filter`` admits (its names files read at its first query)."""
        key = (candidate_filter, entity_type)
        if key not in self._admitted:
            reader = self.reader
            counts = [reader.dir.embeddings_shape(entity_type, part, reader.version)[0]
                      for part in range(self.layout.config.num_partitions(entity_type))]
            self._admitted[key] = candidate_filter.rows(self.layout.entity_path, entity_type, counts)
        return self._admitted[key]

    def answer(self, query: Query, *, k: int = 10, filter_paths: Sequence[str | AnyPath] = (),
               exclude_self: bool = False, feature_separator: str = "", unknown: Unknown = "error",
               candidate_filter: CandidateFilter | None = None) -> Ranking:
        """The top-k of a ``--queries`` line: a featurized side's field is a bag of features, split on
        ``feature_separator`` (:func:`~pbgtrain.predict.featurized.split_features`), the other's a name."""
        side: Side = "lhs" if query.lhs is not None else "rhs"
        text = query.lhs if query.lhs is not None else query.rhs
        if text is not None and self._bags.is_featurized(query.rel, side):
            bag = split_features(text, feature_separator)
            lhs_bag, rhs_bag = (bag, None) if side == "lhs" else (None, bag)
            return self.top_k(rel=query.rel, k=k, filter_paths=filter_paths, lhs_features=lhs_bag,
                              rhs_features=rhs_bag, unknown=unknown, where=query.where,
                              candidate_filter=candidate_filter)
        return self.top_k(rel=query.rel, lhs=query.lhs, rhs=query.rhs, k=k, filter_paths=filter_paths,
                          exclude_self=exclude_self, candidate_filter=candidate_filter)

    def _index(self, entity_type: str, metric: str) -> EmbeddingIndex | str:
        """The index of ``entity_type`` by ``metric`` (loaded at its first query), or why there is
        none to use: the version has indexes of the type, none by that metric."""
        key = (entity_type, metric)
        if key not in self._indexes:
            from pbgio.index import IndexMismatchError, open_index

            try:
                self._indexes[key] = open_index(self.layout, entity_type, metric=metric, version=self.reader.version,
                                                nprobe=self.nprobe)
            except IndexMismatchError as exc:
                self._indexes[key] = (f"the model ranks {entity_type!r} candidates by {metric}, no index of "
                                      f"version {self.reader.version} does: found {'; '.join(exc.found)}; build "
                                      f"one: {exc.build}")
        return self._indexes[key]

    @torch.no_grad()
    def _indexed(self, rel: int | torch.Tensor, side: Side, query_type: str, cand_type: str, query_row: torch.Tensor,
                 known: dict[int, np.ndarray], k: int, admitted: AdmittedRows | None) -> Indexed | str:
        """The best ``k`` through the index (:func:`pbgtrain.predict.indexed.indexed_top_k`), or why
        the index cannot rank these candidates."""
        reader, model, device = self.reader, self.reader.model, self.reader.device
        query_table = EntityTable(query_row.clone(), entity_type=query_type)
        dimension = self.layout.config.entity_dimension(cand_type)
        probe_table = EntityTable(torch.zeros(1, dimension, device=device), entity_type=cand_type)
        zero = torch.zeros(1, dtype=torch.long, device=device)
        lhs_t, rhs_t = (query_table, probe_table) if side == "rhs" else (probe_table, query_table)
        mapped = candidate_space_query(model, lhs_t, rhs_t, zero, rel, zero, side)
        if isinstance(mapped, str):
            return mapped
        vector, metric = mapped
        loaded = self._index(cand_type, metric)
        if isinstance(loaded, str):
            return loaded
        return indexed_top_k(reader, loaded, vector, rel, side, query_type, cand_type, query_row, known, k,
                             self.candidates, admitted)


def _check_query(lhs: str | None, rhs: str | None, k: int, lhs_features: Sequence[str] | None = None,
                 rhs_features: Sequence[str] | None = None) -> None:
    if sum(x is not None for x in (lhs, rhs, lhs_features, rhs_features)) != 1:
        raise PredictError("give exactly one of lhs and rhs (or, for a featurized side, lhs_features and "
                           "rhs_features): the other side is ranked (rank_triple ranks a whole triple)")
    for name, bag in (("lhs_features", lhs_features), ("rhs_features", rhs_features)):
        if isinstance(bag, str):
            raise PredictError(f"expected {name} as a sequence of feature names, found the string {bag!r} (split it: "
                               "pbgtrain.predict.split_features)")
    if k < 1:
        raise PredictError(f"expected k >= 1, found {k}")


def rank_triple(
    config: Layout | CheckpointVersion | str | AnyPath,
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
    opened = open_checkpoint(config, version=version, model=True)
    layout = opened.layout
    relation = Relation.find(layout, rel)
    cfg = layout.config
    lhs_pos = locate_entities(layout.entity_path, relation.lhs, cfg.num_partitions(relation.lhs), [lhs])[lhs]
    rhs_pos = locate_entities(layout.entity_path, relation.rhs, cfg.num_partitions(relation.rhs), [rhs])[rhs]
    filters = [layout.argument_path(str(p)) for p in filter_paths]

    def rank(version: int) -> TripleRank:
        reader = _reader(opened.at(version), device)
        rel_arg = relation.model_rel(reader.device)
        u = rows(reader, relation.lhs, [lhs_pos])
        v = rows(reader, relation.rhs, [rhs_pos])
        positives = pair_scores(reader, relation, rel_arg, u, v)
        ranks = {}
        sides: tuple[tuple[Side, Position, torch.Tensor, Position], ...] = (("rhs", lhs_pos, u, rhs_pos),
                                                                           ("lhs", rhs_pos, v, lhs_pos))
        for side, query, query_row, target in sides:
            query_type, cand_type = relation.types(side)
            known = known_candidates(layout, filters, relation.rel_id, side, query_type, query, cand_type)
            positive = float(positives[side][0])
            scanned = scan(reader, rel_arg, side, cand_type, query_row, known, None, positive, target)
            worst = scanned.candidates + 1
            ranks[side] = (worst if math.isnan(positive) else scanned.at_least[0] + 1, worst)
        return TripleRank(reader.version, lhs, rel, rhs, float(positives["rhs"][0]), float(positives["lhs"][0]),
                          *ranks["rhs"], *ranks["lhs"], [storage.display(p) for p in filters])

    return read_committed(opened.checkpoint, rank, version)


def score_triples(
    config: Layout | CheckpointVersion | str | AnyPath,
    triples: Iterable[Triple | Sequence[str]],
    *,
    version: int | None = None,
    device: str | None = None,
) -> ScoredTriples:
    """The model's scores of (lhs, rel, rhs) name triples, in order.

    Names are resolved first (an unknown one raises :class:`~pbgio.errors.UnknownNameError`
    naming the triple); then the needed entities' rows are read (each partition's once, without
    the rest of it), and the triples are scored in batches of :data:`TRIPLE_BATCH`.
    """
    opened = open_checkpoint(config, version=version, model=True)
    layout = opened.layout
    items = [_as_triple(t, i) for i, t in enumerate(triples)]
    cfg = layout.config
    try:
        rel_ids = locate_relations(cfg, layout.entity_path, [t.rel for t in items])
    except UnknownNameError as exc:
        raise _in_triple(exc, next(t for t in items if t.rel == exc.names[0])) from None
    relations = {name: Relation.of(layout, name, rel_id) for name, rel_id in rel_ids.items()}
    wanted: dict[str, list[str]] = {}  # entity type -> names
    for t in items:
        relation = relations[t.rel]
        wanted.setdefault(relation.lhs, []).append(t.lhs)
        wanted.setdefault(relation.rhs, []).append(t.rhs)
    positions: dict[str, dict[str, Position]] = {}
    for etype, names in wanted.items():
        try:
            positions[etype] = locate_entities(layout.entity_path, etype, cfg.num_partitions(etype), names)
        except UnknownNameError as exc:
            first = next(t for t in items if (t.lhs == exc.names[0] and relations[t.rel].lhs == etype)
                         or (t.rhs == exc.names[0] and relations[t.rel].rhs == etype))
            raise _in_triple(exc, first) from None

    def score(version: int) -> ScoredTriples:
        reader = _reader(opened.at(version), device)
        tables = {etype: EntityTable(rows(reader, etype, list(found.values())), entity_type=etype)
                  for etype, found in positions.items()}
        row_of = {etype: {name: i for i, name in enumerate(found)} for etype, found in positions.items()}
        out: list[TripleScore | None] = [None] * len(items)
        groups: dict[int, list[int]] = {}
        for i, t in enumerate(items):  # static relations: one relation per batch; dynamic: mixed
            groups.setdefault(0 if cfg.dynamic_relations else relations[t.rel].rel_id, []).append(i)
        for members in groups.values():
            for start in range(0, len(members), TRIPLE_BATCH):
                batch = [items[i] for i in members[start:start + TRIPLE_BATCH]]
                relation = relations[batch[0].rel]
                lhs_t, rhs_t = tables[relation.lhs], tables[relation.rhs]
                u = torch.tensor([row_of[relation.lhs][t.lhs] for t in batch], device=reader.device)
                v = torch.tensor([row_of[relation.rhs][t.rhs] for t in batch], device=reader.device)
                rel_arg: int | torch.Tensor = (
                    torch.tensor([relations[t.rel].rel_id for t in batch], device=reader.device)
                    if cfg.dynamic_relations else relation.rel_id)
                pos = pair_scores_ids(reader, lhs_t, rhs_t, u, rel_arg, v)
                for j, (i, t) in enumerate(zip(members[start:start + TRIPLE_BATCH], batch, strict=True)):
                    out[i] = TripleScore(t.lhs, t.rel, t.rhs, float(pos["rhs"][j]), float(pos["lhs"][j]))
        return ScoredTriples(reader.version, cfg.dynamic_relations, [s for s in out if s is not None])

    return read_committed(opened.checkpoint, score, version)


def _as_triple(value: Triple | Sequence[str], index: int) -> Triple:
    if isinstance(value, Triple):
        return value if value.where else value._replace(where=f"triple {index + 1}")
    parts = list(value)
    if len(parts) != 3 or not all(isinstance(p, str) for p in parts):
        raise PredictError(f"triple {index + 1}: expected (lhs, rel, rhs) names, found {value!r}")
    return Triple(parts[0], parts[1], parts[2], f"triple {index + 1}")


def _in_triple(exc: UnknownNameError, triple: Triple) -> UnknownNameError:
    return UnknownNameError(exc.names, exc.what, exc.where, context=triple.where, hint=exc.hint)


def _reader(opened: CheckpointVersion, device: str | None) -> CheckpointReader:
    return CheckpointReader(opened, resolve_device(device, opened.layout))

