"""The second pass: edges of one file mapped to (bucket, lhs offset, rhs offset, rel) in batches.

A polars streaming query reads, checks and hashes the rows and hands them back in
batches, in input order; each batch is joined in memory against the dictionaries (on
the names' 64-bit polars hashes when the dictionaries showed them collision-free,
else on the names), and feature bags are exploded and looked up the same way. Rows
dropped here are *filtered*: their relation or an entity fell below a minimum count
(malformed rows never get here).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl
from numpy.typing import NDArray

from pbgio.edges import FeatureLists
from pbgio.importers.dictionary import Dictionary, KeyKind
from pbgio.importers.plan import SIDES, Checked, ImportPlan, RelationMap, Side, relation_filter

BATCH_ROWS = 1 << 20
FEATURIZED_OFFSET = -1  # lhs/rhs of a featurized entity are ignored; the original's tests poison them with -1

Ints = NDArray[np.int64]


@dataclass
class Vocabulary:
    """Everything the mapping pass looks names up in."""

    entities: dict[str, Dictionary]  # every entity type; the feature dictionary of featurized types
    relations: RelationMap
    key: KeyKind

    def tables(self, plan: ImportPlan, side: Side) -> pl.DataFrame | None:
        plain = [t for t in plan.distinct_types(side) if not plan.featurized(t)]
        if not plain:
            return None
        frames = []
        for entity_type in plain:
            table = self.entities[entity_type].table(self.key)
            if len(plan.distinct_types(side)) > 1:
                table = table.with_columns(type=pl.lit(plan.types.index(entity_type), dtype=pl.Int32))
            frames.append(table)
        renames = {"key": f"{side}_key", "part": f"{side}_part", "offset": f"{side}_off"}
        return pl.concat(frames).rename(renames)


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


def _key(vocab: Vocabulary, column: str) -> pl.Expr:
    return pl.col(column).hash() if vocab.key == "hash" else pl.col(column)


def mapping_query(checked: Checked, plan: ImportPlan, vocab: Vocabulary) -> pl.LazyFrame:
    """Good rows with kept relations: relation id, each side's lookup key (and type), bags, weight."""
    lf = checked.frame.filter(pl.col("problem").is_null() & relation_filter(vocab.relations))
    keep: list[pl.Expr] = [pl.col("rel_id")]
    for side in SIDES:
        if any(not plan.featurized(t) for t in plan.distinct_types(side)):
            keep.append(_key(vocab, side).alias(f"{side}_key"))
        if len(plan.distinct_types(side)) > 1:
            keep.append(pl.col(f"{side}_type"))
        if plan.has_features(side):
            keep.append(pl.col(f"{side}_bag"))
    if "weight" in checked.frame.collect_schema():
        keep.append(pl.col("weight"))
    return lf.select(keep)


def batch_rows_for(vocab: Vocabulary) -> int:
    """Rows per batch: each batch joins against whole dictionaries, so big ones get big batches."""
    largest = max((len(d) for d in vocab.entities.values()), default=0)
    return BATCH_ROWS if largest <= BATCH_ROWS else 4 * BATCH_ROWS


def mapped_batches(query: pl.LazyFrame, plan: ImportPlan, vocab: Vocabulary,
                   batch_rows: int | None = None) -> Iterator[EdgeBatch]:
    """Run the query in streaming batches (input order); look names and features up; yield numpy edges."""
    tables = {side: vocab.tables(plan, side) for side in SIDES}
    features = {side: _feature_table(plan, vocab, side) for side in SIDES if plan.has_features(side)}
    for frame in query.collect_batches(chunk_size=batch_rows or batch_rows_for(vocab), maintain_order=True):
        if frame.height:
            yield _to_batch(_lookup(frame, plan, tables), features, vocab.key)


def _lookup(frame: pl.DataFrame, plan: ImportPlan, tables: dict[Side, pl.DataFrame | None]) -> pl.DataFrame:
    """Join each side's keys to (part, offset); drop rows whose plain entity is not in the dictionary."""
    for side in SIDES:
        table = tables[side]
        if table is None:  # every type on this side is featurized
            frame = frame.with_columns(pl.lit(0, dtype=pl.UInt32).alias(f"{side}_part"),
                                       pl.lit(FEATURIZED_OFFSET, dtype=pl.Int64).alias(f"{side}_off"))
            continue
        on = [f"{side}_key"]
        if "type" in table.columns:
            table = table.rename({"type": f"{side}_type"})
            on.insert(0, f"{side}_type")
        frame = frame.join(table, on=on, how="left", maintain_order="left")
        if plan.has_features(side):  # featurized rows have no entry: they keep their bag instead
            frame = frame.filter(pl.col(f"{side}_bag").is_not_null() | pl.col(f"{side}_off").is_not_null())
            frame = frame.with_columns(pl.col(f"{side}_part").fill_null(0),
                                       pl.col(f"{side}_off").fill_null(FEATURIZED_OFFSET))
        else:
            frame = frame.filter(pl.col(f"{side}_off").is_not_null())
    return frame


def _feature_table(plan: ImportPlan, vocab: Vocabulary, side: Side) -> pl.DataFrame:
    frames = []
    for entity_type in plan.distinct_types(side):
        if plan.featurized(entity_type):
            table = vocab.entities[entity_type].table(vocab.key).select("key", "offset")
            if len(plan.distinct_types(side)) > 1:
                table = table.with_columns(type=pl.lit(plan.types.index(entity_type), dtype=pl.Int32))
            frames.append(table)
    return pl.concat(frames)


def _bags(frame: pl.DataFrame, side: Side, table: pl.DataFrame,
          key: KeyKind) -> tuple[Ints, Ints, NDArray[np.bool_]]:
    """Per row: number of known features, their ids in row order, and whether the row is featurized."""
    n = frame.height
    exploded = frame.select(row=pl.int_range(pl.len(), dtype=pl.Int64), feature=pl.col(f"{side}_bag"),
                            **({"type": pl.col(f"{side}_type")} if "type" in table.columns else {})
                            ).explode("feature").drop_nulls("feature")
    exploded = exploded.with_columns(key=pl.col("feature").hash() if key == "hash" else pl.col("feature"))
    on = ["type", "key"] if "type" in table.columns else ["key"]
    found = exploded.join(table, on=on, how="inner", maintain_order="left")
    rows = found.get_column("row").to_numpy()
    lengths = np.bincount(rows, minlength=n).astype(np.int64)
    featurized = frame.get_column(f"{side}_bag").is_not_null().to_numpy()
    return lengths, found.get_column("offset").to_numpy().astype(np.int64), featurized


def _to_batch(frame: pl.DataFrame, tables: dict[Side, pl.DataFrame], key: KeyKind) -> EdgeBatch:
    n = frame.height
    keep = np.ones(n, dtype=bool)
    bags: dict[Side, tuple[Ints, Ints]] = {}
    for side, table in tables.items():
        lengths, data, featurized = _bags(frame, side, table, key)
        keep &= ~featurized | (lengths > 0)  # a bag whose features all fell below the minimum count
        bags[side] = (lengths, data)
    features: dict[Side, FeatureLists] = {}
    for side, (lengths, data) in bags.items():
        if not keep.all():
            data = data[np.repeat(keep, lengths)]
            lengths = lengths[keep]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        features[side] = FeatureLists(offsets, data)

    def col(name: str) -> Ints:
        values = frame.get_column(name).to_numpy().astype(np.int64, copy=False)
        return values if keep.all() else values[keep]

    weight = None
    if "weight" in frame.columns:
        weight = frame.get_column("weight").to_numpy().astype(np.float32)
        weight = weight if keep.all() else weight[keep]
    return EdgeBatch(col("rel_id"), col("lhs_part"), col("lhs_off"), col("rhs_part"), col("rhs_off"), weight,
                     features.get("lhs"), features.get("rhs"))
