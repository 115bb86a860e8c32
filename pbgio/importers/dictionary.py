"""Entity, feature and relation dictionaries, counted in streaming passes over the inputs.

One polars streaming query per file counts every (entity type, name), every relation
and the malformed rows at once; memory is bounded by the number of distinct names,
not by the number of edges. A dictionary keeps the names with at least ``min_count``
occurrences, sorts them (so the input order does not matter), shuffles them with a
seeded permutation and cuts the result into partitions (:mod:`pbgio.importers.partition`).

>>> counts = pl.DataFrame({"name": ["b", "a", "c", "d"], "n": [3, 1, 2, 5]})
>>> d = build_dictionary("user", counts, min_count=2, num_partitions=2, seed=0)
>>> d.bounds, d.partition(0).to_list(), d.partition(1).to_list()
([0, 2, 3], ['c', 'b'], ['d'])
>>> d.table("name").rows()
[('c', 0, 0), ('b', 0, 1), ('d', 1, 0)]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import polars as pl

from pbgio.importers.partition import partition_bounds, shuffled_order
from pbgio.importers.plan import SIDES, Checked, ImportPlan, RelationMap, relation_filter, side_type
from pbgio.importers.read import describe

PROBLEMS_KEPT = 20
KeyKind = Literal["hash", "name"]

# kind codes of the rows of one counting query
_PROBLEMS, _FIRST_PROBLEMS, _GOOD, _RELATIONS = -1, -2, -3, -4


@dataclass
class FileCounts:
    """What one counting pass found in one file."""

    good: int = 0
    malformed: int = 0
    problems: list[tuple[int, str]] = field(default_factory=list)  # the first few (line, message)
    relations: pl.DataFrame | None = None  # "name" (dynamic) or "id" (static), and "n"
    entities: dict[str, pl.DataFrame] = field(default_factory=dict)  # type -> "name", "n"

    @property
    def rows(self) -> int:
        return self.good + self.malformed


def count_file(checked: Checked, plan: ImportPlan, relations: RelationMap, *,
               count_relations: bool, count_entities: bool) -> FileCounts:
    """Count problems, relations and (type, name) occurrences of one checked frame (one query)."""
    frame = checked.frame.cache()  # one parse feeds every count below
    good = frame.filter(pl.col("problem").is_null())
    bad = frame.filter(pl.col("problem").is_not_null())
    parts: list[pl.LazyFrame] = [
        bad.select(kind=pl.lit(_PROBLEMS), n=pl.len().cast(pl.Int64)),
        bad.sort("line").head(PROBLEMS_KEPT).with_columns(kind=pl.lit(_FIRST_PROBLEMS)),
        good.select(kind=pl.lit(_GOOD), n=pl.len().cast(pl.Int64)),
    ]
    if count_relations:
        key = pl.col("rel").alias("name") if relations.names is None else pl.col("rel_id").alias("id")
        parts.append(good.group_by(key).agg(n=pl.len().cast(pl.Int64)).with_columns(kind=pl.lit(_RELATIONS)))
    if count_entities:
        rows = good if relations.names is None else good.filter(relation_filter(relations))
        for side in SIDES:
            distinct = plan.distinct_types(side)
            for entity_type in distinct:
                index = plan.types.index(entity_type)
                sub = rows if len(distinct) == 1 else rows.filter(side_type(plan, side) == index)
                if plan.featurized(entity_type):
                    names = sub.select(name=pl.col(f"{side}_bag")).explode("name")
                else:
                    names = sub.select(name=pl.col(side))
                parts.append(names.group_by("name").agg(n=pl.len().cast(pl.Int64))
                             .with_columns(kind=pl.lit(index)))
    result = pl.concat(parts, how="diagonal_relaxed").collect(engine="streaming")
    counts = FileCounts()
    for (kind,), part in result.partition_by("kind", as_dict=True, maintain_order=False).items():
        if kind == _PROBLEMS:
            counts.malformed = int(part["n"][0])
        elif kind == _FIRST_PROBLEMS:
            described = part.sort("line").select("line", describe(checked.checks).alias("message"))
            counts.problems = [(int(line), str(msg)) for line, msg in described.iter_rows()]
        elif kind == _GOOD:
            counts.good = int(part["n"][0])
        elif kind == _RELATIONS:
            counts.relations = part.select("id" if relations.names is not None else "name", "n")
        else:
            # lhs and rhs rows of one type share a kind
            counts.entities[plan.types[int(kind)]] = _sum_counts([part.select("name", "n")], "name")
    return counts


def _sum_counts(frames: Iterable[pl.DataFrame], key: str) -> pl.DataFrame:
    return pl.concat(list(frames)).group_by(key).agg(pl.col("n").sum())


class Counter:
    """Occurrence counts summed over files, kept as small as the distinct keys."""

    def __init__(self) -> None:
        self.entities: dict[str, pl.DataFrame] = {}
        self.relations: pl.DataFrame | None = None

    def add(self, counts: FileCounts) -> None:
        for entity_type, frame in counts.entities.items():
            have = self.entities.get(entity_type)
            self.entities[entity_type] = frame if have is None else _sum_counts([have, frame], "name")
        if counts.relations is not None:
            key = counts.relations.columns[0]
            self.relations = (counts.relations if self.relations is None
                              else _sum_counts([self.relations, counts.relations], key))


@dataclass
class Dictionary:
    """The names of one entity type (the features, for a featurized type) in layout order.

    ``names[bounds[p]:bounds[p+1]]`` are partition ``p``'s names; a name's offset is its
    index within that slice.
    """

    entity_type: str
    names: pl.Series
    bounds: list[int]

    def __len__(self) -> int:
        return len(self.names)

    def count(self, part: int) -> int:
        return self.bounds[part + 1] - self.bounds[part]

    def partition(self, part: int) -> pl.Series:
        return self.names.slice(self.bounds[part], self.count(part))

    def table(self, key: KeyKind) -> pl.DataFrame:
        """``key`` (the name or its polars hash), ``part`` (UInt32) and ``offset`` (Int64) per name."""
        n = len(self.names)
        parts = np.repeat(np.arange(len(self.bounds) - 1, dtype=np.uint32), np.diff(self.bounds))
        offsets = np.arange(n, dtype=np.int64) - np.repeat(np.asarray(self.bounds[:-1], np.int64),
                                                           np.diff(self.bounds))
        keys = self.names.hash() if key == "hash" else self.names
        return pl.DataFrame({"key": keys, "part": parts, "offset": offsets})


def build_dictionary(entity_type: str, counts: pl.DataFrame | None, *, min_count: int, num_partitions: int,
                     seed: int) -> Dictionary:
    """Keep names seen ``min_count`` times or more, sort, shuffle (seeded), cut into partitions."""
    if counts is None or counts.is_empty():
        names = pl.Series("name", [], dtype=pl.String)
    else:
        names = counts.filter(pl.col("n") >= min_count).get_column("name").sort()
        names = names.gather(shuffled_order(len(names), seed=seed, salt=entity_type))
    return Dictionary(entity_type, names.rename("name"), partition_bounds(len(names), num_partitions))


def hashes_are_unique(counts: pl.DataFrame | None) -> bool:
    """Whether the polars hashes of all names seen (kept or not) are distinct, so joins may use them."""
    if counts is None or counts.is_empty():
        return True
    return int(counts.get_column("name").hash().n_unique()) == counts.height


def relation_names(counts: pl.DataFrame | None, min_count: int) -> list[str]:
    """Dynamic relation names seen ``min_count`` times or more, sorted (ids follow this order)."""
    if counts is None:
        return []
    return counts.filter(pl.col("n") >= min_count).get_column("name").sort().to_list()


def kept_relation_ids(counts: pl.DataFrame | None, num_relations: int,
                      min_count: int) -> frozenset[int] | None:
    """Static relation ids seen ``min_count`` times or more; None when nothing is dropped."""
    if min_count <= 1:
        return None
    seen: dict[int, int] = {}
    if counts is not None:
        seen = {int(i): int(n) for i, n in counts.select("id", "n").iter_rows() if i is not None}
    return frozenset(i for i in range(num_relations) if seen.get(i, 0) >= min_count)
