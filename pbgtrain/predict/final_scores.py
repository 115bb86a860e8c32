"""The scores ``pbgtrain predict`` prints for the top k: each candidate scored alone.

A scan scores candidates a block at a time, and a search through an index scores the rows it
proposed together; a matrix product may round a row's score differently with other rows beside
it (6.10065 through the index, 6.10064 exactly). So the ``k`` candidates a top-k returns are
scored once more, each alone, with the model's own scoring (:func:`pbgtrain.model.score_candidates`
on a table of one row, on the reader's device), and ordered by that score (equal scores: lower
partition, then lower row: :func:`pbgio.topk.reordered`): a candidate gets the same score, to the
bit, from the exact scan and through an index. ``k`` small calls per query.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pbgio.topk import reordered
from pbgtrain.checkpoint_reader import CheckpointReader
from pbgtrain.model import EntityTable, score_candidates
from pbgtrain.predict.results import Side

Scored = list[tuple[float, int, int]]


@torch.no_grad()
def scored_one_by_one(reader: CheckpointReader, rel: int | torch.Tensor, side: Side, query_type: str, cand_type: str,
                      query_row: torch.Tensor, best: Sequence[tuple[float, int, int]]) -> Scored:
    """``best`` ``(score, partition, offset)`` of ``cand_type`` (the ``side`` ranked for the query
    row ``query_row`` of ``query_type``) with each score computed again for that row alone,
    best first; each partition's rows read once, alone."""
    device = reader.device
    query_table = EntityTable(query_row.clone(), entity_type=query_type)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    scores: dict[tuple[int, int], float] = {}
    for part in sorted({p for _, p, _ in best}):
        offsets = np.array(sorted({o for _, p, o in best if p == part}), np.int64)
        weights = torch.from_numpy(reader.dir.read_embedding_rows(cand_type, part, reader.version, offsets))
        for i, offset in enumerate(offsets):
            table = EntityTable(weights[i:i + 1].to(device), entity_type=cand_type, partition=part)
            lhs_t, rhs_t = (query_table, table) if side == "rhs" else (table, query_table)
            _, block = score_candidates(reader.model, lhs_t, rhs_t, zero, rel, zero, side, zero)
            scores[(part, int(offset))] = float(block.float().cpu()[0, 0])
    return reordered(best, [scores[(p, o)] for _, p, o in best])
