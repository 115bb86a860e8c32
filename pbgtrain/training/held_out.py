"""The held-out edges of a bucket (``eval_fraction``), ranked before and after training on it.

As the original: each held-out edge is ranked against the eval negatives (``eval_num_batch_negs``
same-batch and ``eval_num_uniform_negs`` uniform ones), both sides; a graph smaller than its eval
negatives ranks against every entity of the partition instead, exactly, while the loss stays the
sampled objective's. Which, and the batches, are the run's :class:`pbgtrain.ranking.EvalPlan`,
the plan ``pbgtrain eval`` builds too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from pbgio.config import ConfigSchema
from pbgtrain.metrics import RankingAccumulator
from pbgtrain.model import BucketEdges, EmbeddingModel, EntityTable
from pbgtrain.ranking import EvalPlan
from pbgtrain.schedule.batching import stable_seed
from pbgtrain.schedule.buckets import Bucket

TableOf = Callable[[str, Bucket, str], EntityTable]
"""The resident table of (entity type, bucket, side)."""


class HeldOutRanking:
    """How a run ranks its held-out edges (its :class:`~pbgtrain.ranking.EvalPlan`), and the ranking itself."""

    def __init__(self, model: EmbeddingModel, config: ConfigSchema, counts: Collection[int], seed: int) -> None:
        self.model = model
        self.config = config
        self.seed = seed
        self.plan = EvalPlan.build(model.spec, config, counts, held_out=True)

    @torch.no_grad()
    def rank(self, idx: torch.Tensor, edges: BucketEdges, bucket: Bucket, table: TableOf,
             generator: torch.Generator) -> RankingAccumulator:
        """The held-out edges ``idx`` of ``edges`` ranked with the bucket's tables."""
        cfg = self.config
        acc = RankingAccumulator(self.plan.protocol, seed=stable_seed("auc", self.seed, bucket.lhs, bucket.rhs))
        groups = [(0, idx)] if cfg.dynamic_relations else [
            (r, idx[edges.rel[idx] == r]) for r in range(len(cfg.relations))]
        for r, sel in groups:
            if not len(sel):
                continue  # no held-out edge of this relation
            relation = cfg.relations[r]
            lhs_t, rhs_t = table(relation.lhs, bucket, "lhs"), table(relation.rhs, bucket, "rhs")
            self.plan.rank(acc, self.model, lhs_t, rhs_t, edges, sel, r, generator)
        return acc
