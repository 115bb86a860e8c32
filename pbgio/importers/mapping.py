"""The second pass: edges of one file mapped to (bucket, lhs offset, rhs offset, rel) in batches.

Each block of a file (see :mod:`~pbgio.importers.read`) is checked again and its good
rows, in file order, are looked up: every name in its type's
:class:`~pbgio.importers.dictionary.Dictionary` (vectorized, see
:mod:`~pbgio.importers.nameindex`) and feature bags are exploded and looked up the same
way. Rows dropped here are *filtered*: their relation or an entity fell below a minimum
count (malformed rows never get here).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl
from numpy.typing import NDArray

from pbgio.edges import FeatureLists
from pbgio.importers.dictionary import Dictionary
from pbgio.importers.plan import SIDES, Checked, ImportPlan, RelationMap, Side, relation_filter

FEATURIZED_OFFSET = -1  # lhs/rhs of a featurized entity are ignored; the original's tests poison them with -1

Ints = NDArray[np.int64]
Bools = NDArray[np.bool_]


@dataclass
class Vocabulary:
    """Everything the mapping pass looks names up in."""

    entities: dict[str, Dictionary]  # every entity type; the feature dictionary of featurized types
    relations: RelationMap


@dataclass
class EdgeBatch:
    """Mapped edges of one batch, in input order."""

    rel: Ints
    lhs_part: Ints
    lhs: Ints
    rhs_part: Ints
    rhs: Ints
    weight: NDArray[np.float32] | None
    lhs_features: FeatureLists | None
    rhs_features: FeatureLists | None

    def __len__(self) -> int:
        return len(self.rel)


def mapped_batches(checked: Checked, plan: ImportPlan, vocab: Vocabulary) -> Iterator[EdgeBatch]:
    """Good rows with kept relations, block by block (file order), looked up into numpy edges."""
    keep: list[str] = ["rel_id"]
    for side in SIDES:
        if any(not plan.featurized(t) for t in plan.distinct_types(side)):
            keep.append(side)
        if len(plan.distinct_types(side)) > 1:
            keep.append(f"{side}_type")
        if plan.has_features(side):
            keep.append(f"{side}_bag")
    if "weight" in checked.source.columns:
        keep.append("weight")
    good = pl.col("problem").is_null() & relation_filter(vocab.relations)
    for frame in checked.batches(lambda lf: lf.filter(good).select(keep)):
        if frame.height:
            yield _to_batch(frame, plan, vocab)


def _rows_of(frame: pl.DataFrame, plan: ImportPlan, side: Side, entity_type: str) -> Bools | None:
    """Rows whose ``side`` has ``entity_type`` (None: all of them)."""
    if len(plan.distinct_types(side)) == 1:
        return None
    return (frame.get_column(f"{side}_type") == plan.types.index(entity_type)).to_numpy()


def _entities(frame: pl.DataFrame, plan: ImportPlan, vocab: Vocabulary, side: Side) -> tuple[Ints, Ints, Bools]:
    """Partition and offset of each row's plain ``side`` entity, and whether it was found.

    Featurized rows get partition 0, offset :data:`FEATURIZED_OFFSET` and count as found.
    """
    types = plan.distinct_types(side)
    if len(types) == 1 and not plan.featurized(types[0]):  # the common case: one plain type
        part, offset = vocab.entities[types[0]].locate(frame.get_column(side))
        return part, offset, offset >= 0
    n = frame.height
    part = np.zeros(n, dtype=np.int64)
    offset = np.full(n, FEATURIZED_OFFSET, dtype=np.int64)
    found = np.ones(n, dtype=bool)
    for entity_type in types:
        if plan.featurized(entity_type):
            continue
        rows = _rows_of(frame, plan, side, entity_type)
        names = frame.get_column(side)
        p, o = vocab.entities[entity_type].locate(names if rows is None else names.filter(rows))
        where = slice(None) if rows is None else rows
        part[where], offset[where], found[where] = p, o, o >= 0
    return part, offset, found


def _features(frame: pl.DataFrame, plan: ImportPlan, vocab: Vocabulary, side: Side) -> tuple[Ints, Ints, Bools]:
    """Per row: number of known features, their offsets in row order, and whether the row is featurized."""
    n = frame.height
    row_ids: list[Ints] = []
    offsets: list[Ints] = []
    featurized = np.zeros(n, dtype=bool)
    for entity_type in plan.distinct_types(side):
        if not plan.featurized(entity_type):
            continue
        rows = _rows_of(frame, plan, side, entity_type)
        mine = np.arange(n, dtype=np.int64) if rows is None else np.flatnonzero(rows)
        featurized[mine] = True
        exploded = pl.DataFrame({"row": mine, "feature": frame.get_column(f"{side}_bag").gather(mine)})
        exploded = exploded.explode("feature").drop_nulls("feature")
        _, offset = vocab.entities[entity_type].locate(exploded.get_column("feature"))
        known = offset >= 0
        row_ids.append(exploded.get_column("row").to_numpy()[known])
        offsets.append(offset[known])
    rows_all = np.concatenate(row_ids) if row_ids else np.zeros(0, np.int64)
    data = np.concatenate(offsets) if offsets else np.zeros(0, np.int64)
    order = np.argsort(rows_all, kind="stable")  # row order, features in bag order
    lengths = np.bincount(rows_all, minlength=n).astype(np.int64)
    return lengths, data[order], featurized


def _to_batch(frame: pl.DataFrame, plan: ImportPlan, vocab: Vocabulary) -> EdgeBatch:
    n = frame.height
    keep = np.ones(n, dtype=bool)
    located: dict[Side, tuple[Ints, Ints]] = {}
    bags: dict[Side, tuple[Ints, Ints]] = {}
    for side in SIDES:
        part, offset, found = _entities(frame, plan, vocab, side)
        keep &= found
        located[side] = (part, offset)
        if plan.has_features(side):
            lengths, data, featurized = _features(frame, plan, vocab, side)
            keep &= ~featurized | (lengths > 0)  # a bag whose features all fell below the minimum count
            bags[side] = (lengths, data)
    every = bool(keep.all())

    def kept(values: Ints) -> Ints:
        return values if every else values[keep]

    features: dict[Side, FeatureLists] = {}
    for side, (lengths, data) in bags.items():
        if not every:
            data, lengths = data[np.repeat(keep, lengths)], lengths[keep]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        features[side] = FeatureLists(offsets, data)
    weight = None
    if "weight" in frame.columns:
        weight = frame.get_column("weight").to_numpy().astype(np.float32)
        weight = weight if every else weight[keep]
    rel = frame.get_column("rel_id").to_numpy().astype(np.int64, copy=False)
    return EdgeBatch(kept(rel), kept(located["lhs"][0]), kept(located["lhs"][1]), kept(located["rhs"][0]),
                     kept(located["rhs"][1]), weight, features.get("lhs"), features.get("rhs"))
