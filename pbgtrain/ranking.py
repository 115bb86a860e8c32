"""Ranking against every entity of a partition, in bounded blocks (``pbgtrain eval --filter``, and
the held-out figures of a graph small enough that sampled negatives would repeat entities).

>>> ranks_every_entity(num_negatives=2_050, num_entities=135), ranks_every_entity(2_050, 14_541)
(True, False)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pbgio.topk import rows_per_block
from pbgtrain.metrics import FilterIndex, RankingAccumulator
from pbgtrain.model import EmbeddingModel, EntityTable, ModelSpec, score_candidates

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


def eval_ranks_every_entity(spec: ModelSpec, batch_size: int, counts: Iterable[int]) -> bool:
    """Whether the sampled protocol (``eval_num_batch_negs``, at most a batch, plus
    ``eval_num_uniform_negs``) gives way to every entity: no partition (of ``counts``) has more
    entities than that, and no type is featurized (those have no table to rank against)."""
    neg = spec.eval_negatives
    num_negatives = min(neg.num_batch_negs, batch_size) + neg.num_uniform_negs
    return not spec.featurized and ranks_every_entity(num_negatives, max(counts, default=0))


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
                      filter_index: FilterIndex | None = None) -> None:
    """Rank each edge (lhs, rel, rhs) against every entity of the corrupted side's table, leaving
    out the positive's own column and, with ``filter_index``, every candidate forming a known edge."""
    rows = all_entities_batch(max(lhs_t.num_entities, rhs_t.num_entities))
    for start in range(0, len(lhs), rows):
        end = start + rows
        b_lhs, b_rhs = lhs[start:end], rhs[start:end]
        b_rel: int | torch.Tensor = rel if isinstance(rel, int) else rel[start:end]
        for side in acc.protocol.sides:
            pos, cand = score_candidates(model, lhs_t, rhs_t, b_lhs, b_rel, b_rhs, side)
            num = cand.shape[1]
            if filter_index is not None:
                exclude = filter_index.mask(side, b_lhs.cpu(), b_rel if isinstance(b_rel, int) else b_rel.cpu(),
                                            b_rhs.cpu(), num_entities=num, include_positive=True).to(cand.device)
            else:
                exclude = torch.zeros_like(cand, dtype=torch.bool)
            positive = b_rhs if side == "rhs" else b_lhs
            exclude[torch.arange(len(positive), device=cand.device), positive] = True  # the positive's own column
            acc.add(side, pos, cand, exclude)
