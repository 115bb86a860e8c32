"""How ``pbgtrain predict`` scores by name: a relation and its types, the stored rows of named
entities (read alone), the known edges a filter leaves out, and the exact scan of every candidate
of a type (:func:`pbgio.topk.scan_partitions`, the scan ``pbgio neighbors`` uses too), each
partition streamed a bounded chunk at a time (:class:`pbgio.index.RowWindow`), never whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pbgio.candidates import AdmittedRows
from pbgio.edges import EdgeBucket, read_bucket
from pbgio.index import RowWindow
from pbgio.layout import Layout
from pbgio.names import Position, locate_relations
from pbgio.spec import naming
from pbgio.storage import AnyPath
from pbgio.topk import BlockScores, PartitionScan, rows_per_block, scan_partitions
from pbgtrain.checkpoint_reader import CheckpointReader
from pbgtrain.model import EntityTable, FeatureBags, score_candidates
from pbgtrain.predict.results import PredictError, Side
from pbgtrain.schedule.buckets import PartitionSides, all_buckets

ROW_BUDGET = 1 << 24
"""Candidate rows × dimension scored at once (a block: 64 MiB of float32 per copy)."""
MAX_BLOCK_ROWS = 1 << 16


@dataclass(frozen=True)
class Relation:
    """A relation by name: its id (static index or dynamic id) and its entity types."""

    name: str
    rel_id: int
    lhs: str
    rhs: str
    dynamic: bool

    @classmethod
    def find(cls, layout: Layout, name: str, *, bags: Sequence[Side] = ()) -> Relation:
        return cls.of(layout, name, locate_relations(layout.config, layout.entity_path, [name])[name], bags=bags)

    @classmethod
    def of(cls, layout: Layout, name: str, rel_id: int, *, bags: Sequence[Side] = ()) -> Relation:
        """The relation ``name`` (id ``rel_id``); a featurized side is refused unless it is one of
        ``bags``, the sides given as bags of features (:mod:`pbgtrain.predict.featurized`)."""
        cfg = layout.config
        schema = cfg.relations[0 if cfg.dynamic_relations else rel_id]
        for side in ("lhs", "rhs"):
            etype = getattr(schema, side)
            if cfg.entities[etype].featurized and side not in bags:
                other = "rhs" if side == "lhs" else "lhs"
                instead = ("" if cfg.entities[getattr(schema, other)].featurized or bags else
                           f"; to rank the {other} candidates of a bag, give the bag (--{side}-features)")
                raise PredictError(f"relation {name!r}: its {side} type {etype!r} is featurized: its entities are "
                                   f"bags of features, with no names to look up and no table to rank{instead}")
        return cls(name, rel_id, schema.lhs, schema.rhs, cfg.dynamic_relations)

    def types(self, side: Side) -> tuple[str, str]:
        """(query type, candidate type) when ranking ``side``."""
        return (self.lhs, self.rhs) if side == "rhs" else (self.rhs, self.lhs)

    def model_rel(self, device: torch.device) -> int | torch.Tensor:
        """The relation as the model takes it for one edge: an index, or a [1] tensor of the dynamic id."""
        return torch.tensor([self.rel_id], device=device) if self.dynamic else self.rel_id


def rows(reader: CheckpointReader, entity_type: str, positions: Sequence[Position]) -> torch.Tensor:
    """The stored rows of ``positions`` ([len, D], on the reader's device), each partition's read
    without the rest of it."""
    dim = reader.layout.config.entity_dimension(entity_type)
    out = torch.empty(len(positions), dim)
    by_part: dict[int, list[int]] = {}
    for i, pos in enumerate(positions):
        by_part.setdefault(pos.partition, []).append(i)
    for part, members in sorted(by_part.items()):
        offsets = np.array([positions[i].offset for i in members], np.int64)
        num_rows = reader.dir.embeddings_shape(entity_type, part, reader.version)[0]
        if offsets.max() >= num_rows:
            path = reader.layout.entity_path / naming.entity_names_file(entity_type, part)
            raise PredictError(f"{path}: expected {num_rows} names (the rows of "
                               f"{reader.dir.embeddings_path(entity_type, part, reader.version)}), found more "
                               "[entity-names-count]")
        out[members] = torch.from_numpy(reader.dir.read_embedding_rows(entity_type, part, reader.version, offsets))
    return out.to(reader.device)


def known_candidates(layout: Layout, filter_paths: list[AnyPath], rel_id: int, side: Side, query_type: str,
                      query: Position, cand_type: str,
                      is_query: Callable[[EdgeBucket], np.ndarray] | None = None) -> dict[int, np.ndarray]:
    """Rows of each candidate partition that form a known edge (relation ``rel_id``) with the query
    in the filter edge paths: every bucket holding the query's partition on its side is read.
    ``is_query`` marks a bucket's edges whose query side is the query (default: its offset's)."""
    if not filter_paths:
        return {}
    partitions = PartitionSides.from_config(layout.config)
    query_side: Side = "lhs" if side == "rhs" else "rhs"
    found: dict[int, list[np.ndarray]] = {}
    for directory in filter_paths:
        for bucket in all_buckets(*layout.config.bucket_grid()):
            if partitions.partition_of(query_type, bucket, query_side) != query.partition:
                continue
            edges = read_bucket(directory / naming.bucket_file(bucket.lhs, bucket.rhs))
            query_ids, cand_ids = (edges.lhs, edges.rhs) if side == "rhs" else (edges.rhs, edges.lhs)
            same = is_query(edges) if is_query is not None else query_ids == query.offset
            hits = cand_ids[(edges.rel == rel_id) & same]
            if len(hits):
                found.setdefault(partitions.partition_of(cand_type, bucket, side), []).append(hits)
    return {part: np.unique(np.concatenate(ids)) for part, ids in found.items()}


@torch.no_grad()
def scan(reader: CheckpointReader, rel: int | torch.Tensor, side: Side, cand_type: str, query_row: torch.Tensor,
          known: dict[int, np.ndarray], k: int | None, positive: float | None = None,
          target: Position | None = None, query_bag: FeatureBags | None = None,
          admitted: AdmittedRows | None = None) -> PartitionScan:
    """Score the query (one row, of the other side's type) against every entity of ``cand_type``,
    partition by partition and block by block (:func:`pbgio.topk.scan_partitions`; a block's rows
    alone make its table, from the partition's chunks as they stream by); keep the best
    ``k`` and count the candidates scoring at least ``positive``. Known edges and the ``target``'s
    own slot are left out. A featurized query is ``query_bag``, one bag of the rows ``query_row``.
    With ``admitted`` (a candidate filter), only the rows it admits are candidates."""
    model = reader.model
    device = reader.device
    query_type = model.relation(rel).lhs if side == "rhs" else model.relation(rel).rhs
    query_table = EntityTable(query_row.clone(), entity_type=query_type)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    bags = {} if query_bag is None else {"lhs_bags" if side == "rhs" else "rhs_bags": query_bag}

    def open_partition(part: int) -> tuple[int, BlockScores]:
        num_rows = reader.dir.embeddings_shape(cand_type, part, reader.version)[0]
        window = RowWindow(reader.dir.iter_embedding_rows(cand_type, part, reader.version))

        def scores(start: int, stop: int) -> np.ndarray:
            table = EntityTable(torch.from_numpy(window(start, stop)).to(device), entity_type=cand_type,
                                partition=part)
            lhs_table, rhs_table = (query_table, table) if side == "rhs" else (table, query_table)
            cand = torch.arange(stop - start, device=device)
            lhs_ids, rhs_ids = (zero, cand[:1]) if side == "rhs" else (cand[:1], zero)
            _, block = score_candidates(model, lhs_table, rhs_table, lhs_ids, rel, rhs_ids, side, cand, **bags)
            return block.float().cpu().numpy()

        return num_rows, scores

    step = rows_per_block(reader.layout.config.entity_dimension(cand_type), ROW_BUDGET, MAX_BLOCK_ROWS)
    return scan_partitions(range(reader.layout.config.num_partitions(cand_type)), open_partition, k=k,
                           block_rows=step, exclude=known,
                           skip=(target.partition, target.offset) if target is not None else None,
                           at_least=[positive] if positive is not None else None,
                           admitted=None if admitted is None else admitted.by_partition())


@torch.no_grad()
def pair_scores(reader: CheckpointReader, relation: Relation, rel: int | torch.Tensor, u: torch.Tensor,
                 v: torch.Tensor) -> dict[str, torch.Tensor]:
    """Both sides' positive scores of edges between rows ``u`` and ``v`` ([B, D] each)."""
    lhs_t = EntityTable(u.clone(), entity_type=relation.lhs)
    rhs_t = EntityTable(v.clone(), entity_type=relation.rhs)
    ids = torch.arange(len(u), device=reader.device)
    return pair_scores_ids(reader, lhs_t, rhs_t, ids, rel, ids)


@torch.no_grad()
def pair_scores_ids(reader: CheckpointReader, lhs_t: EntityTable, rhs_t: EntityTable, u: torch.Tensor,
                     rel: int | torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{"rhs": scores ranking rhs candidates, "lhs": scores ranking lhs candidates}`` of edges
    (u[i], rel, v[i]) of the tables, on the CPU."""
    out = {}
    for side, own in (("rhs", v), ("lhs", u)):
        pos, _ = score_candidates(reader.model, lhs_t, rhs_t, u, rel, v, side, own.unsqueeze(1))
        out[side] = pos.float().cpu()
    return out

