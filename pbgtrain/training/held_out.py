"""The held-out edges of a bucket (``eval_fraction``), ranked before and after training on it.

As the original: each held-out edge is ranked against the eval negatives (``eval_num_batch_negs``
same-batch and ``eval_num_uniform_negs`` uniform ones), both sides; a graph smaller than its eval
negatives ranks against every entity of the partition instead
(:func:`pbgtrain.ranking.eval_ranks_every_entity`), exactly, while the loss stays the sampled
objective's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from pbgio.config import ConfigSchema
from pbgtrain.metrics import SIDES, EvalProtocol, RankingAccumulator
from pbgtrain.model import BucketEdges, EmbeddingModel, EntityTable, eval_step
from pbgtrain.plan.batching import stable_seed
from pbgtrain.plan.buckets import Bucket
from pbgtrain.ranking import eval_ranks_every_entity, rank_all_entities
from pbgtrain.training.records import add_negative_scores

TableOf = Callable[[str, Bucket, str], EntityTable]
"""The resident table of (entity type, bucket, side)."""


class HeldOutRanking:
    """How a run ranks its held-out edges, and the ranking itself."""

    def __init__(self, model: EmbeddingModel, config: ConfigSchema, counts: Collection[int], seed: int) -> None:
        self.model = model
        self.config = config
        self.seed = seed
        self.every_entity = eval_ranks_every_entity(model.spec, config.batch_size, counts)
        neg = model.spec.eval_negatives  # a chunk of batch negatives never exceeds a batch
        num_batch_negs = min(neg.num_batch_negs, config.batch_size)
        self.protocol = EvalProtocol.sampled(num_batch_negs, neg.num_uniform_negs)
        if self.every_entity:
            self.protocol = EvalProtocol(False, f"all entities of the partition as candidates (at most "
                                         f"{max(counts):,}, no more than the "
                                         f"{num_batch_negs + neg.num_uniform_negs:,} eval negatives)", SIDES)

    @torch.no_grad()
    def rank(self, idx: torch.Tensor, edges: BucketEdges, bucket: Bucket, table: TableOf,
             generator: torch.Generator) -> RankingAccumulator:
        """The held-out edges ``idx`` of ``edges`` ranked with the bucket's tables."""
        cfg = self.config
        acc = RankingAccumulator(self.protocol, seed=stable_seed("auc", self.seed, bucket.lhs, bucket.rhs))
        groups = [(0, idx)] if cfg.dynamic_relations else [
            (r, idx[edges.rel[idx] == r]) for r in range(len(cfg.relations))]
        for r, sel in groups:
            relation = cfg.relations[r]
            for start in range(0, len(sel), cfg.batch_size):
                part = sel[start:start + cfg.batch_size]
                rel_of: int | torch.Tensor = edges.rel[part] if cfg.dynamic_relations else r
                batch = edges.batch(part, rel_of, *self.model.spec.featurized_sides(relation))
                lhs_t, rhs_t = table(relation.lhs, bucket, "lhs"), table(relation.rhs, bucket, "rhs")
                result = eval_step(self.model, lhs_t, rhs_t, batch, generator=generator)
                if self.every_entity:  # the loss is the sampled objective's; the ranks are exact
                    rank_all_entities(acc, self.model, lhs_t, rhs_t, batch.lhs, batch.rel, batch.rhs)
                else:
                    add_negative_scores(acc, result.scores)
                acc.add_loss(result.loss, result.count)
        return acc
