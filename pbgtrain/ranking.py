"""How edges are ranked, the rule once: the evaluation plan (:class:`EvalPlan`) that ``pbgtrain
eval`` (and ``fit --valid``) and the held-out figures of ``fit`` both build and use, and ranking
against every entity of a partition, in bounded blocks (``pbgtrain eval --filter``, and the
held-out figures of a graph small enough that sampled negatives would repeat entities).

>>> ranks_every_entity(num_negatives=2_050, num_entities=135), ranks_every_entity(2_050, 14_541)
(True, False)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from pbgio.config import ConfigSchema
from pbgio.topk import rows_per_block
from pbgtrain.featurized_ranking import negative_sides, not_ranked, table_sides
from pbgtrain.metrics import SIDES, EvalProtocol, FilterIndex, RankingAccumulator
from pbgtrain.model import (
    MASKED_SCORE,
    BucketEdges,
    EmbeddingModel,
    EntityTable,
    FeatureBags,
    ModelSpec,
    eval_step,
    score_candidates,
)

ALL_ENTITIES_BATCH = 500
"""Edges scored at once against all entities (a [batch, entities] score matrix per side), at most."""
SCORE_MATRIX_BUDGET = 1 << 25
"""Score-matrix elements per side at once (128 MiB of float32): with millions of candidates the
all-entities batch shrinks so memory stays bounded, on a GPU as on a CPU."""


def ranks_every_entity(num_negatives: int, num_entities: int) -> bool:
    """Whether sampled ranking would draw as many negatives as there are entities or more: then
    every entity is a candidate instead. Drawn with repeats, such negatives give ranks above the
    number of entities (a mean rank of 246 among 135 entities); every entity gives the exact
    figure, a rank never above ``num_entities``, and costs no more."""
    return num_negatives >= num_entities


@dataclass(frozen=True)
class EvalPlan:
    """How a run's edges are ranked, decided once (:meth:`build`) and used by both rankers: the
    held-out edges of ``fit`` (:class:`pbgtrain.training.held_out.HeldOutRanking`) and ``pbgtrain
    eval`` (:func:`pbgtrain.evaluate.evaluate_checkpoint`, ``fit --valid`` too).

    Sampled ranking takes ``eval_num_batch_negs`` same-batch negatives, at most a batch (a chunk
    of batch negatives never exceeds one), and ``eval_num_uniform_negs`` uniform ones. It gives
    way to every entity of the partition when asked (``--all-entities``, ``--filter``), or when no
    partition has more entities than those negatives (:func:`ranks_every_entity`) and no type is
    featurized (those have no table to rank against).

    >>> from pbgio.example import example_config
    >>> config = example_config()
    >>> plan = EvalPlan.build(ModelSpec.from_config(config), config, [10_000, 3_000])
    >>> plan.num_batch_negs, plan.num_uniform_negs, plan.every_entity, plan.protocol.describe()
    (100, 1000, False, 'raw, 100 batch + 1,000 uniform negatives, both sides averaged')
    >>> plan = EvalPlan.build(ModelSpec.from_config(config), config, [1_000, 40], held_out=True)
    >>> plan.every_entity, plan.protocol.candidates
    (True, 'all entities of the partition as candidates (at most 1,000, no more than the 1,100 eval negatives)')
    """

    num_batch_negs: int
    """Same-batch negatives of an edge: ``eval_num_batch_negs``, at most ``batch_size``."""
    num_uniform_negs: int
    every_entity: bool
    """Whether every entity of the partition is a candidate (else the sampled negatives)."""
    protocol: EvalProtocol
    batch_size: int
    dynamic_relations: bool
    featurized_sides: tuple[tuple[bool, bool], ...]
    """Of each relation of the config: whether its lhs and rhs types are featurized."""
    with_loss: bool
    """Whether ranking against every entity still takes each batch's eval step, for the sampled
    objective's loss (the held-out figures); else it ranks the edges alone, no loss, no draw."""

    @classmethod
    def build(cls, spec: ModelSpec, config: ConfigSchema, counts: Collection[int], *, all_entities: bool = False,
              filter_sources: Sequence[str] = (), held_out: bool = False) -> EvalPlan:
        """The plan of ``spec`` and ``config``, with ``counts`` the entities of each partition.
        ``all_entities``: every entity asked for (``filter_sources``: the filter edge paths' names,
        that ask for it too). ``held_out``: the held-out figures of ``fit`` (both sides stated,
        each batch's loss kept) rather than ``pbgtrain eval``'s (the sides that take negatives)."""
        neg = spec.eval_negatives
        num_batch_negs = min(neg.num_batch_negs, config.batch_size)
        num_negatives = num_batch_negs + neg.num_uniform_negs
        every_entity = all_entities or (not spec.featurized and ranks_every_entity(num_negatives,
                                                                                   max(counts, default=0)))
        if held_out:
            protocol = EvalProtocol.sampled(num_batch_negs, neg.num_uniform_negs)
            if every_entity:
                protocol = EvalProtocol(False, f"all entities of the partition as candidates (at most "
                                        f"{max(counts):,}, no more than the {num_negatives:,} eval negatives)", SIDES)
        else:
            protocol = _eval_protocol(spec, config, counts, every_entity, num_batch_negs, filter_sources)
        return cls(num_batch_negs, neg.num_uniform_negs, every_entity, protocol, config.batch_size,
                   config.dynamic_relations, tuple(spec.featurized_sides(r) for r in config.relations), held_out)

    def edges_per_step(self, lhs_t: EntityTable, rhs_t: EntityTable) -> int:
        """The edges :meth:`rank` takes at once with these tables: a block ranked against every entity
        (:func:`all_entities_batch`), else a batch. Ranking edges in pieces of whole steps gives the
        figures of one call (the same batches, the same draws)."""
        if self.every_entity and not self.with_loss:
            return all_entities_batch(max(lhs_t.num_entities, rhs_t.num_entities))
        return self.batch_size

    def candidates(self, r: int, sides: Sequence[str], lhs_entities: int, rhs_entities: int) -> list[int]:
        """The candidates an edge of the config's relation ``r`` is ranked against, on each of ``sides``
        that :meth:`rank` ranks, its lhs and rhs tables holding ``lhs_entities`` and ``rhs_entities``:
        against every entity, those of the side's table (a featurized side has none: not ranked);
        sampled, the batch negatives, and the uniform ones but on a featurized side."""
        featurized: dict[str, bool] = dict(zip(SIDES, self.featurized_sides[r], strict=True))
        if self.every_entity:
            return [lhs_entities if side == "lhs" else rhs_entities for side in sides if not featurized[side]]
        return [self.num_batch_negs + (0 if featurized[side] else self.num_uniform_negs) for side in sides]

    @torch.no_grad()
    def rank(self, acc: RankingAccumulator, model: EmbeddingModel, lhs_t: EntityTable, rhs_t: EntityTable,
             edges: BucketEdges, sel: torch.Tensor, r: int, generator: torch.Generator,
             filter_index: FilterIndex | None = None) -> None:
        """Rank the edges ``sel`` of ``edges`` into ``acc``: those of the config's relation ``r`` (with
        dynamic relations, its one relation: each edge's own id), with its tables ``lhs_t`` and
        ``rhs_t``; sampled negatives are drawn from ``generator``, batch by batch, and against every
        entity the candidates forming a known edge of ``filter_index`` are left out."""
        if self.every_entity and not self.with_loss:
            whole = edges.batch(sel, edges.rel[sel] if self.dynamic_relations else r, *self.featurized_sides[r])
            rank_all_entities(acc, model, lhs_t, rhs_t, whole.lhs, whole.rel, whole.rhs, filter_index,
                              lhs_bags=whole.lhs_bags, rhs_bags=whole.rhs_bags)
            return
        for start in range(0, len(sel), self.batch_size):
            part = sel[start:start + self.batch_size]
            batch = edges.batch(part, edges.rel[part] if self.dynamic_relations else r, *self.featurized_sides[r])
            result = eval_step(model, lhs_t, rhs_t, batch, generator=generator)
            if self.every_entity:  # the loss is the sampled objective's; the ranks are exact
                rank_all_entities(acc, model, lhs_t, rhs_t, batch.lhs, batch.rel, batch.rhs, filter_index,
                                  lhs_bags=batch.lhs_bags, rhs_bags=batch.rhs_bags)
            else:
                add_negative_scores(acc, result.scores)
            acc.add_loss(result.loss, result.count)


def _eval_protocol(spec: ModelSpec, config: ConfigSchema, counts: Collection[int], every_entity: bool,
                   num_batch_negs: int, filter_sources: Sequence[str]) -> EvalProtocol:
    """What ``pbgtrain eval`` states of its ranks: on the sides that take negatives, the sampled
    ones (a featurized side's batch negatives only), or every entity (filtered with filter paths)."""
    sides = negative_sides(config)
    if not every_entity:
        neg = spec.eval_negatives
        sampled = EvalProtocol.sampled(num_batch_negs, neg.num_uniform_negs, sides=sides)
        if neg.num_uniform_negs and spec.featurized:
            return replace(sampled, candidates=f"{sampled.candidates} (featurized sides: batch negatives only)")
        return sampled
    sizes = sorted(set(counts))
    size = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}–{sizes[-1]:,}"
    partitioned = any(e.num_partitions > 1 for e in config.entities.values())
    protocol = EvalProtocol.all_entities(0, filtered=bool(filter_sources), sides=table_sides(config),
                                         filter_sources=filter_sources)  # (featurized: no table, not ranked)
    what = f"all {size} entities of the partition as candidates" if partitioned \
        else f"all {size} entities as candidates"
    return EvalProtocol(protocol.filtered, what, protocol.sides, protocol.filter_sources, not_ranked(config))


def add_negative_scores(acc: RankingAccumulator, scores: Any) -> None:
    """Rank each side's positives against its negatives; masked slots (self pairs, padding) excluded."""
    for side in SIDES:
        pos, neg = (scores.lhs_pos, scores.lhs_neg) if side == "lhs" else (scores.rhs_pos, scores.rhs_neg)
        if neg.shape[1]:
            acc.add(side, pos, neg, exclude=neg <= MASKED_SCORE)


def all_entities_batch(num_candidates: int) -> int:
    """Edges ranked at once against ``num_candidates`` entities (bounded by :data:`SCORE_MATRIX_BUDGET`;
    the block rule of the top-k scan, :func:`pbgio.topk.rows_per_block`, with a block of edges).

    >>> all_entities_batch(14_541), all_entities_batch(4_800_000), all_entities_batch(10**9)
    (500, 6, 1)
    """
    return rows_per_block(num_candidates, SCORE_MATRIX_BUDGET, ALL_ENTITIES_BATCH)


@torch.no_grad()
def rank_all_entities(acc: RankingAccumulator, model: EmbeddingModel, lhs_t: EntityTable, rhs_t: EntityTable,
                      lhs: torch.Tensor, rel: int | torch.Tensor, rhs: torch.Tensor,
                      filter_index: FilterIndex | None = None, *, lhs_bags: FeatureBags | None = None,
                      rhs_bags: FeatureBags | None = None) -> None:
    """Rank each edge (lhs, rel, rhs) against every entity of the corrupted side's table, leaving
    out the positive's own column and, with ``filter_index``, every candidate forming a known edge.
    A featurized side comes as its bags (``lhs_bags``, ``rhs_bags``): it is not ranked (it has no
    table), the other side is ranked for its bags; its ids then only key the filter
    (:func:`pbgtrain.featurized_ranking.keyed_filter`)."""
    rows = all_entities_batch(max(lhs_t.num_entities, rhs_t.num_entities))
    sides = [s for s in acc.protocol.sides if (lhs_bags if s == "lhs" else rhs_bags) is None]
    for start in range(0, len(lhs), rows):
        end = start + rows
        b_lhs, b_rhs = lhs[start:end], rhs[start:end]
        b_rel: int | torch.Tensor = rel if isinstance(rel, int) else rel[start:end]
        block = torch.arange(start, min(end, len(lhs)), device=lhs.device)
        b_lhs_bags, b_rhs_bags = (None if bags is None else bags.take(block) for bags in (lhs_bags, rhs_bags))
        for side in sides:
            pos, cand = score_candidates(model, lhs_t, rhs_t, b_lhs, b_rel, b_rhs, side, lhs_bags=b_lhs_bags,
                                         rhs_bags=b_rhs_bags)
            num = cand.shape[1]
            if filter_index is not None:
                exclude = filter_index.mask(side, b_lhs.cpu(), b_rel if isinstance(b_rel, int) else b_rel.cpu(),
                                            b_rhs.cpu(), num_entities=num, include_positive=True).to(cand.device)
            else:
                exclude = torch.zeros_like(cand, dtype=torch.bool)
            positive = b_rhs if side == "rhs" else b_lhs
            exclude[torch.arange(len(positive), device=cand.device), positive] = True  # the positive's own column
            acc.add(side, pos, cand, exclude)
