"""What held-out figures do not say: edges of a held-out split whose entities no training edge names
(their vectors were never trained), and test edges whose reverse is a training edge (inverse and
symmetric leakage: a model that learnt ``hyponym`` answers ``hypernym`` by reversing it, which
lifts the MRR of such a split; Toutanova & Chen 2015, Akrami et al. 2020).

Both stream the edge paths bucket by bucket through :func:`pbgio.edges.read_bucket`: they hold one
bool per entity (the entities named by training edges) or one training bucket at a time (its
``(lhs, rhs)`` pairs, to look up the reverse of the test edges of the mirrored bucket).

* :func:`untrained_edges`: the edges of some paths with an entity that no edge of the training
  paths names;
* :func:`reverse_leakage`: per relation, the test edges ``(h, r, t)`` whose twin ``(t, r, h)``
  (symmetric) or whose reverse ``(t, r', h)`` under another relation ``r'`` (inverse) is in train.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pbgio.edges import read_bucket
from pbgio.entities import read_entity_count
from pbgio.layout import Layout
from pbgio.names import relation_names
from pbgio.spec import naming
from pbgio.storage import AnyPath

__all__ = ["RelationLeakage", "reverse_leakage", "reverses_possible", "untrained_edges"]


def _buckets(layout: Layout) -> list[tuple[int, int]]:
    nl, nr = layout.config.bucket_grid()
    return [(i, j) for i in range(nl) for j in range(nr)]


def _sides(layout: Layout, rel: np.ndarray) -> list[tuple[np.ndarray, str, str]]:
    """(the edges' positions, lhs type, rhs type) per relation of the config present in ``rel``."""
    cfg = layout.config
    if cfg.dynamic_relations:
        return [(np.arange(len(rel)), cfg.relations[0].lhs, cfg.relations[0].rhs)]
    return [(np.flatnonzero(rel == r), relation.lhs, relation.rhs) for r, relation in enumerate(cfg.relations)]


def _part(layout: Layout, entity_type: str, bucket_part: int) -> int:
    return bucket_part if layout.config.num_partitions(entity_type) > 1 else 0


DENSE_MAX = 1 << 30
"""Entities of a partition held as one bool each (1 GiB at most); a count file claiming more (10^15: legal
by the format, and a few bytes) is held as the sorted ids the training edges name, bounded by the edges."""


class _Named:
    """The entities of one partition that training edges name: a bool per entity, or (a count above
    :data:`DENSE_MAX`) the sorted distinct ids named, never an allocation sized by the count alone.

    >>> named = _Named(10**15)
    >>> named.mark(np.array([7, 10**15 - 1, 7]))
    >>> named.known(np.array([7, 8, 10**15 - 1])).tolist()
    [True, False, True]
    """

    def __init__(self, count: int) -> None:
        self.dense = np.zeros(count, dtype=bool) if count <= DENSE_MAX else None
        self.ids = np.empty(0, dtype=np.int64)
        self.pending: list[np.ndarray] = []

    def mark(self, ids: np.ndarray) -> None:
        if self.dense is not None:
            self.dense[ids] = True
        else:
            self.pending.append(np.unique(ids))

    def known(self, ids: np.ndarray) -> np.ndarray:
        if self.dense is not None:
            found: np.ndarray = self.dense[ids]
            return found
        if self.pending:
            self.ids, self.pending = np.unique(np.concatenate([self.ids, *self.pending])), []
        at = np.minimum(np.searchsorted(self.ids, ids), max(len(self.ids) - 1, 0))
        return self.ids[at] == ids if len(self.ids) else np.zeros(len(ids), dtype=bool)


def untrained_edges(layout: Layout, trained: list[AnyPath], evaluated: list[AnyPath]) -> tuple[int, int]:
    """(edges of ``evaluated`` with an entity that no edge of ``trained`` names, edges of ``evaluated``)."""
    named: dict[tuple[str, int], _Named] = {}

    def seen(entity_type: str, part: int) -> _Named:
        key = (entity_type, part)
        if key not in named:
            named[key] = _Named(read_entity_count(layout.entity_path, entity_type, part))
        return named[key]

    for directory in trained:
        for i, j in _buckets(layout):
            edges = read_bucket(directory / naming.bucket_file(i, j))
            for at, lhs_type, rhs_type in _sides(layout, edges.rel):
                seen(lhs_type, _part(layout, lhs_type, i)).mark(edges.lhs[at])
                seen(rhs_type, _part(layout, rhs_type, j)).mark(edges.rhs[at])
    untrained = total = 0
    for directory in evaluated:
        for i, j in _buckets(layout):
            edges = read_bucket(directory / naming.bucket_file(i, j))
            total += len(edges)
            for at, lhs_type, rhs_type in _sides(layout, edges.rel):
                known = seen(lhs_type, _part(layout, lhs_type, i)).known(edges.lhs[at]) & \
                    seen(rhs_type, _part(layout, rhs_type, j)).known(edges.rhs[at])
                untrained += int((~known).sum())
    return untrained, total


@dataclass(frozen=True)
class RelationLeakage:
    """One relation's test edges, and how many of them have a reversed twin in train."""

    relation: str
    edges: int
    inverse: int  # (t, r', h) in train for a relation r' other than r
    symmetric: int  # (t, r, h) in train
    inverse_or_symmetric: int  # either (an edge may have both)

    def to_dict(self) -> dict[str, Any]:
        return {"relation": self.relation, "edges": self.edges, "inverse": self.inverse,
                "symmetric": self.symmetric, "inverse_or_symmetric": self.inverse_or_symmetric}

    def line(self) -> str:
        def share(n: int) -> str:
            return f"{n / self.edges:.1%}" if self.edges else "-"

        edges = f"{self.edges:,} edge{'' if self.edges == 1 else 's'}"
        return (f"{self.relation}: {edges}, {share(self.inverse_or_symmetric)} with a reverse in train "
                f"(inverse {share(self.inverse)}, symmetric {share(self.symmetric)})")


def _relation_types(layout: Layout, count: int) -> list[tuple[str, str]]:
    """The (lhs, rhs) entity types of each of ``count`` relation ids (dynamic relations: the template's)."""
    cfg = layout.config
    if cfg.dynamic_relations:
        return [(cfg.relations[0].lhs, cfg.relations[0].rhs)] * count
    return [(relation.lhs, relation.rhs) for relation in cfg.relations]


def reverses_possible(layout: Layout) -> bool:
    """Whether an edge can have a reverse at all: some relation goes from a type to another (or the
    same) type that some relation goes back from (an author → document graph has none)."""
    cfg = layout.config
    pairs = {(relation.lhs, relation.rhs) for relation in cfg.relations}
    return any((rhs, lhs) in pairs for lhs, rhs in pairs)


def reverse_leakage(layout: Layout, train: AnyPath, test: AnyPath) -> list[RelationLeakage]:
    """Per relation (in relation id order, those with test edges), the test edges ``(h, r, t)`` of
    ``test`` whose reverse ``(t, r', h)`` is an edge of ``train``: for ``r' = r`` symmetric, for
    another ``r'`` inverse. A reverse joins the same entities the other way, so ``r'`` goes from
    ``r``'s right type to its left one (an id of another type is another entity); it lies in the
    train bucket of the swapped partitions."""
    names = relation_names(layout.config, layout.entity_path)
    types = _relation_types(layout, len(names))
    group_of = {pair: g for g, pair in enumerate(dict.fromkeys(types))}
    group = np.array([group_of[pair] for pair in types], dtype=np.int64)
    counts = np.zeros((len(names), 4), dtype=np.int64)  # edges, inverse, symmetric, either
    for i, j in _buckets(layout):
        test_edges = read_bucket(test / naming.bucket_file(i, j))
        if not len(test_edges):
            continue
        rel = test_edges.rel.astype(np.int64)
        np.add.at(counts[:, 0], rel, 1)
        for (lhs_type, rhs_type), g in group_of.items():
            mine = np.flatnonzero(group[rel] == g)
            back = group_of.get((rhs_type, lhs_type))
            if not len(mine) or back is None:
                continue
            bucket = (_part(layout, rhs_type, j), _part(layout, lhs_type, i))
            train_edges = read_bucket(train / naming.bucket_file(*bucket))
            keep = np.flatnonzero(group[train_edges.rel.astype(np.int64)] == back)
            inverse, symmetric = _reverses(train_edges.lhs[keep], train_edges.rel[keep], train_edges.rhs[keep],
                                           test_edges.lhs[mine], rel[mine], test_edges.rhs[mine], len(names))
            for column, hits in ((1, inverse), (2, symmetric), (3, inverse | symmetric)):
                np.add.at(counts[:, column], rel[mine][hits], 1)
    return [RelationLeakage(names[r], int(n), int(inv), int(sym), int(either))
            for r, (n, inv, sym, either) in enumerate(counts.tolist()) if n]


def _reverses(train_lhs: np.ndarray, train_rel: np.ndarray, train_rhs: np.ndarray, lhs: np.ndarray,
              rel: np.ndarray, rhs: np.ndarray, relations: int) -> tuple[np.ndarray, np.ndarray]:
    """For each edge ``(lhs, rel, rhs)``: whether ``(rhs, r', lhs)`` is a train edge for some ``r' != rel``
    (inverse), and whether ``(rhs, rel, lhs)`` is one (symmetric)."""
    none = np.zeros(len(lhs), dtype=bool)
    if not len(train_lhs) or not len(lhs):
        return none, none
    width = int(max(train_lhs.max(), train_rhs.max(), lhs.max(), rhs.max())) + 1
    pairs, pair_id = np.unique(train_lhs.astype(np.int64) * width + train_rhs, return_inverse=True)
    triples = np.unique(pair_id.astype(np.int64) * relations + train_rel)  # distinct (pair, relation)
    relations_of_pair = np.bincount(triples // relations, minlength=len(pairs))
    wanted = rhs.astype(np.int64) * width + lhs
    at = np.minimum(np.searchsorted(pairs, wanted), len(pairs) - 1)
    found = pairs[at] == wanted
    symmetric = found & np.isin(at.astype(np.int64) * relations + rel, triples)
    inverse = found & (relations_of_pair[at] > symmetric)
    return inverse, symmetric
