"""Top-k through a candidate type's index (``pbgtrain predict --index``): the index proposes rows
for the query moved into the candidates' space, the model scores them.

The index is asked for ``proposals`` rows (default :data:`pbgio.index.DEFAULT_CANDIDATES`, at
least ``k``) plus the known edges to leave out; with a candidate filter, that many divided by
the share of rows it admits, then :data:`pbgio.index.widening.GROWTH` times more while fewer than
``k`` of the proposals pass (admitted, not a known edge), until the index has no more to give
(:func:`pbgio.index.widening.widened_proposals`). The rows that pass are scored by the model
exactly as the exact scan scores them, partition by partition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from pbgio.candidates import AdmittedRows
from pbgio.topk import TopK
from pbgtrain.checkpoint_reader import CheckpointReader
from pbgtrain.model import EntityTable, score_candidates
from pbgtrain.predict.results import Side

if TYPE_CHECKING:
    from pbgio.index import EmbeddingIndex, Widened


@dataclass(frozen=True)
class Indexed:
    """The best ``k`` through the index: ``candidates`` (the rows it could have returned),
    ``excluded`` (known edges among them), how it was searched, and how far it was asked."""

    best: list[tuple[float, int, int]]
    candidates: int
    excluded: int
    searched: str
    widened: Widened


@torch.no_grad()
def indexed_top_k(reader: CheckpointReader, loaded: EmbeddingIndex, vector: torch.Tensor, rel: int | torch.Tensor,
                  side: Side, query_type: str, cand_type: str, query_row: torch.Tensor, known: dict[int, np.ndarray],
                  k: int, proposals: int | None, admitted: AdmittedRows | None) -> Indexed:
    """The best ``k`` of ``cand_type`` for the query row ``query_row`` (``vector``: the query in
    the candidates' space), through ``loaded``; ``known`` rows left out, only ``admitted`` rows kept."""
    from pbgio.index import DEFAULT_CANDIDATES

    device = reader.device
    num_known = sum(len(offsets) for offsets in known.values())
    want = max(k, proposals or DEFAULT_CANDIDATES)

    def passes(_: int, parts: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        keep = np.ones(len(parts), dtype=bool) if admitted is None else admitted.admits(parts, offsets)
        for part, known_rows in known.items():
            keep &= ~((parts == part) & np.isin(offsets, known_rows))
        return keep

    [widened] = loaded.propose_passing(vector.float().cpu().numpy()[None], passes, need=k, count=want,
                                       share=1.0 if admitted is None else admitted.share, extra=num_known)
    query_table = EntityTable(query_row.clone(), entity_type=query_type)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    best = TopK(k)
    for part in np.unique(widened.partitions):
        mine = widened.offsets[widened.partitions == part]
        weights = reader.dir.read_embedding_rows(cand_type, int(part), reader.version, mine)
        table = EntityTable(torch.from_numpy(weights).to(device), entity_type=cand_type, partition=int(part))
        lhs_t, rhs_t = (query_table, table) if side == "rhs" else (table, query_table)
        cand = torch.arange(len(mine), device=device)
        lhs_ids, rhs_ids = (zero, cand[:1]) if side == "rhs" else (cand[:1], zero)
        _, block = score_candidates(reader.model, lhs_t, rhs_t, lhs_ids, rel, rhs_ids, side, cand)
        best.add(block.float().cpu().numpy()[0], int(part), mine)
    if admitted is None:
        return Indexed(best.items(), loaded.meta.rows - num_known, num_known,
                       f"{loaded.describe(proposals)}: the model scored the {want + num_known:,} rows it proposed",
                       widened)
    excluded = admitted.count_in(known)
    rounds = f" in {widened.rounds} rounds" if widened.rounds > 1 else ""
    known_edges = " and form no known edge" if known else ""
    return Indexed(best.items(), admitted.count - excluded, excluded,
                   f"{loaded.describe(proposals)}: asked for {widened.asked:,} rows{rounds}, the model scored the "
                   f"{widened.passed:,} of the {widened.proposed:,} it proposed that pass the candidate "
                   f"filter{known_edges}", widened)
