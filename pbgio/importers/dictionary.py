"""Entity, feature and relation dictionaries, counted batch by batch over the inputs.

The counting pass checks each file block by block (in file order, see
:mod:`~pbgio.importers.read`) and counts, per block: malformed rows (keeping the first
few with their messages), relations, and the names of every entity type in a
:class:`NameIndex`. Memory is bounded by the distinct names and one block, not by the
number of edges.

A dictionary keeps the names with at least ``min_count`` occurrences, sorts them (so
the input order does not matter), shuffles them with a seeded permutation and cuts
the result into partitions (:mod:`pbgio.importers.partition`).

>>> index = NameIndex()
>>> index.add(pl.Series(["b", "a", "c", "d", "b", "b", "c", "d", "d", "d", "d"]))
>>> d = build_dictionary("user", index, min_count=2, num_partitions=2, seed=0)
>>> d.bounds, d.partition(0).to_list(), d.partition(1).to_list()
([0, 2, 3], ['c', 'b'], ['d'])
>>> d.locate(pl.Series(["d", "a", "b"]))
(array([ 1, -1,  0]), array([ 0, -1,  1]))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import polars as pl
from numpy.typing import NDArray

from pbgio.importers.nameindex import NameIndex
from pbgio.importers.partition import partition_bounds, shuffled_order
from pbgio.importers.plan import SIDES, Checked, ImportPlan, RelationMap, relation_filter
from pbgio.importers.read import describe

PROBLEMS_KEPT = 20

Ints = NDArray[np.int64]


@dataclass
class FileCounts:
    """What the counting pass found in one file (names are counted into the shared :class:`Counter`)."""

    good: int = 0
    malformed: int = 0
    problems: list[tuple[int, str]] = field(default_factory=list)  # the first few (line, message)

    @property
    def rows(self) -> int:
        return self.good + self.malformed


class Counter:
    """Occurrences over all files: one :class:`NameIndex` per entity type, and the relations."""

    def __init__(self, plan: ImportPlan) -> None:
        self.plan = plan
        self.entities = {t: NameIndex() for t in plan.types}
        self.relation_names = NameIndex()  # dynamic relations
        self.relation_ids: Ints = np.zeros(len(plan.static_names()), np.int64)  # static relations

    def count_file(self, checked: Checked, relations: RelationMap, *, count_relations: bool,
                   count_entities: bool, on_block: Callable[[float], None] | None = None) -> FileCounts:
        """Count one checked file block by block (problems always; relations and entities as asked)."""
        counts = FileCounts()
        for batch in checked.batches(on_block=on_block):
            problem = batch.get_column("problem").is_not_null()
            bad = int(problem.sum())
            if bad:
                counts.malformed += bad
                if len(counts.problems) < PROBLEMS_KEPT:
                    first = batch.filter(problem).head(PROBLEMS_KEPT - len(counts.problems))
                    described = first.select("line", describe(checked.checks).alias("message"))
                    counts.problems += [(int(line), str(msg)) for line, msg in described.iter_rows()]
                batch = batch.filter(~problem)
            counts.good += batch.height
            if count_relations:
                self._count_relations(batch, relations)
            if count_entities:
                self._count_entities(batch if relations.names is None else batch.filter(relation_filter(relations)))
        return counts

    def _count_relations(self, good: pl.DataFrame, relations: RelationMap) -> None:
        if relations.names is None:
            self.relation_names.add(good.get_column("rel"))
        else:
            ids = good.get_column("rel_id").drop_nulls().to_numpy()
            self.relation_ids += np.bincount(ids, minlength=len(self.relation_ids))[: len(self.relation_ids)]

    def _count_entities(self, rows: pl.DataFrame) -> None:
        plan = self.plan
        found: dict[str, list[pl.Series]] = {}
        for side in SIDES:
            distinct = plan.distinct_types(side)
            for entity_type in distinct:
                of_type = pl.col(f"{side}_type") == plan.types.index(entity_type)
                sub = rows if len(distinct) == 1 else rows.filter(of_type)
                if plan.featurized(entity_type):
                    names = sub.get_column(f"{side}_bag").explode().drop_nulls()
                else:
                    names = sub.get_column(side)
                found.setdefault(entity_type, []).append(names.rename("name"))
        for entity_type, names_list in found.items():  # one count per type, both sides at once
            self.entities[entity_type].add(pl.concat(names_list))


@dataclass
class Dictionary:
    """The names of one entity type (the features, for a featurized type) and where they go.

    ``order`` holds the name ids in layout order: ``order[bounds[p]:bounds[p+1]]`` are
    partition ``p``'s names, and a name's offset is its index within that slice.
    ``index`` finds a name's id; ``part_of`` and ``offset_of`` place it: they hold one
    entry per id (-1 for names below the minimum count) and a last -1, which the id -1 of
    an unknown name picks. The names themselves are needed only to write the entity files:
    :meth:`drop_names` frees them (and the counts) before the edges are mapped.
    """

    entity_type: str
    names: pl.Series | None  # by id
    order: Ints
    bounds: list[int]
    index: NameIndex
    part_of: NDArray[np.int32]
    offset_of: NDArray[np.int32]

    def __len__(self) -> int:
        return len(self.order)

    def count(self, part: int) -> int:
        return self.bounds[part + 1] - self.bounds[part]

    def partition(self, part: int) -> pl.Series:
        """The names of partition ``part``, in offset order."""
        if self.names is None:
            raise ValueError(f"the names of {self.entity_type!r} were dropped")
        return self.names.gather(self.order[self.bounds[part]: self.bounds[part + 1]])

    def drop_names(self) -> None:
        self.names = None
        self.index.drop_names()

    def locate(self, names: pl.Series) -> tuple[Ints, Ints]:
        """Partition and offset of each name; -1 for names that are not in the dictionary."""
        ids = self.index.lookup(names)
        return self.part_of[ids].astype(np.int64), self.offset_of[ids].astype(np.int64)


def build_dictionary(entity_type: str, index: NameIndex, *, min_count: int, num_partitions: int,
                     seed: int) -> Dictionary:
    """Keep names seen ``min_count`` times or more, sort, shuffle (seeded), cut into partitions."""
    names = index.names()
    kept = index.counts >= min_count
    every = bool(kept.all())
    index.compact()
    by_name = name_order(names if every else names.filter(pl.Series(kept)))
    sorted_ids = by_name if every else np.flatnonzero(kept)[by_name]
    order = sorted_ids[shuffled_order(len(sorted_ids), seed=seed, salt=entity_type)].astype(np.int64, copy=False)
    bounds = partition_bounds(len(order), num_partitions)
    part_of = np.full(len(index) + 1, -1, dtype=np.int32)
    offset_of = np.full(len(index) + 1, -1, dtype=np.int32)
    for part in range(num_partitions):
        ids = order[bounds[part]: bounds[part + 1]]
        part_of[ids] = part
        offset_of[ids] = np.arange(len(ids), dtype=np.int32)
    return Dictionary(entity_type, names, order, bounds, index, part_of, offset_of)


SORT_BLOCK = 2_000_000
"""Names sorted at a time by :func:`name_order` (a sort holds about 30 bytes a name beside them)."""


def name_order(names: pl.Series) -> Ints:
    """The positions of distinct ``names`` in sorted (UTF-8 byte) order: ``names.arg_sort()``,
    about :data:`SORT_BLOCK` names sorted at a time. Splitters drawn from a seeded sample cut the
    names into ranges; each range is sorted alone, and the ranges follow each other in order.

    >>> name_order(pl.Series(["b", "", "é", "a", "ab"])).tolist()
    [1, 3, 4, 0, 2]
    """
    ranges = -(-len(names) // SORT_BLOCK)
    if ranges <= 1:
        return names.arg_sort().to_numpy().astype(np.int64)
    sample = names.sample(n=min(len(names), 1000 * ranges), seed=0).sort()
    splitters = sample.gather(np.linspace(0, len(sample) - 1, ranges + 1)[1:-1].round().astype(np.int64)).unique()
    range_of = splitters.sort().search_sorted(names, side="left").to_numpy()
    pieces = []
    for number in range(len(splitters) + 1):
        positions = np.flatnonzero(range_of == number)
        pieces.append(positions[names.gather(positions).arg_sort().to_numpy()])
    return np.concatenate(pieces)


def relation_names(index: NameIndex, min_count: int) -> list[str]:
    """Dynamic relation names seen ``min_count`` times or more, sorted (ids follow this order)."""
    names: list[str] = index.names().filter(pl.Series(index.counts >= min_count)).sort().to_list()
    return names


def kept_relation_ids(counts: Ints, min_count: int) -> frozenset[int] | None:
    """Static relation ids seen ``min_count`` times or more; None when nothing is dropped."""
    if min_count <= 1:
        return None
    return frozenset(int(i) for i in np.flatnonzero(counts >= min_count))
