"""Ranking against every entity when some entity types are featurized (``pbgtrain eval --filter``
and ``--all-entities``): which sides have a table to rank, and when two bags are the same entity.

A featurized entity is a bag of features, not a row of a table, so a featurized side cannot be
ranked against "every entity"; the other side of its relation can, when it is plain: every
entity of that type is scored for the bag, as ``pbgtrain predict --lhs-features`` scores them.
:func:`table_sides` says which sides are ranked (those that take negatives and whose type is plain
in a relation) and :func:`not_ranked` which are not, for the protocol to state; when no relation
has a side to rank (:func:`same_batch_only`), ``pbgtrain eval`` refuses to rank against every
entity (:func:`check_table_side`) and ``pbgtrain fit --valid`` ranks same-batch candidates instead.
``fit --valid`` otherwise ranks as ``eval --filter`` does, through the same code
(:func:`pbgtrain.evaluate.evaluate_checkpoint`), so the version it keeps is the best by the figure
``eval --filter`` then measures.

Filtered ranking leaves out the candidates that form a known edge with the query. A bag has no
id (the importer writes -1), so a featurized entity is known by its bag: two bags holding the
same features, each as many times, in any order, are the same entity (they have the same
embedding, the mean of their features). :func:`bag_keys` numbers bags by that rule and
:func:`keyed_filter` builds the filter index of a bucket with a featurized side's ids replaced
by those numbers, in the known edges and in the evaluated ones alike.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

import numpy as np

from pbgio.checks.config import featurized_ranking
from pbgio.checks.edges import featurized_missing
from pbgio.config import ConfigSchema
from pbgio.edges import EdgeBucket, FeatureLists
from pbgio.errors import ConfigError, FormatError
from pbgtrain.metrics import SIDES, FilterIndex, NotRanked, Side
from pbgtrain.model import ModelSpec


def negative_sides(config: ConfigSchema) -> tuple[Side, ...]:
    """The sides of ``config``'s edges that ``pbgtrain eval`` ranks: those that take negatives."""
    return tuple(s for s in SIDES if not getattr(config, f"disable_{s}_negs"))


def table_sides(config: ConfigSchema) -> tuple[Side, ...]:
    """The sides ranked against every entity: of the sides that take negatives, those whose entity
    type is plain in at least one relation of ``config`` (empty: no relation has a side to rank)."""
    featurized = set(config.featurized_types())
    return tuple(s for s in negative_sides(config) if any(getattr(r, s) not in featurized for r in config.relations))


def not_ranked(config: ConfigSchema) -> tuple[NotRanked, ...]:
    """The sides that take negatives and are featurized, so that ranking against every entity
    leaves them out (the relation is None with dynamic relations: every relation id)."""
    featurized = set(config.featurized_types())
    return tuple(NotRanked(None if config.dynamic_relations else r.name, s, getattr(r, s))
                 for r in config.relations for s in negative_sides(config) if getattr(r, s) in featurized)


def same_batch_only(config: ConfigSchema) -> bool:
    """Whether ``config``'s featurized types leave no side to rank against every entity: then
    ``pbgtrain eval`` ranks same-batch candidates only (:func:`check_table_side` refuses the rest)
    and so does ``pbgtrain fit --valid``."""
    return bool(config.featurized_types()) and not table_sides(config)


def check_table_side(source: str, featurized: Collection[str], ranked: Sequence[Side], option: str) -> None:
    """Refuse ranking against every entity (asked by the command-line ``option``) when the
    ``featurized`` types leave no side to rank (``ranked``: the sides ranked, of every relation)
    (``config-featurized-all-negs``)."""
    if not featurized or ranked:
        return
    raise ConfigError(source, [featurized_ranking(source, sorted(featurized), option)])


def bag_keys(*lists: FeatureLists) -> list[np.ndarray]:
    """One number per bag of each of ``lists``: two bags get the same number exactly when they hold
    the same features, each as many times, in any order (vectorized: one sort, then one
    ``np.unique`` per distinct bag size).

    >>> a = FeatureLists.from_lists([[3, 1], [1, 3], [1, 1, 3], []])
    >>> b = FeatureLists.from_lists([[1, 3, 1], [2], []])
    >>> [k.tolist() for k in bag_keys(a, b)]
    [[2, 2, 3, 0], [3, 1, 0]]
    """
    sizes = np.concatenate([np.diff(f.offsets) for f in lists]) if lists else np.zeros(0, np.int64)
    data = np.concatenate([f.data[f.offsets[0]:f.offsets[-1]] for f in lists]) if lists else np.zeros(0, np.int64)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    ordered = data[np.lexsort((data, owner))]  # each bag's features sorted, bags in order
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64) if len(sizes) else sizes
    keys = np.empty(len(sizes), dtype=np.int64)
    taken = 0
    for size in np.unique(sizes):
        members = np.flatnonzero(sizes == size)
        if size == 0:
            keys[members] = taken
            taken += 1
            continue
        rows = ordered[starts[members, None] + np.arange(size)]
        _, inverse = np.unique(rows, axis=0, return_inverse=True)
        keys[members] = taken + inverse.reshape(-1)
        taken += int(inverse.max()) + 1
    return np.split(keys, np.cumsum([len(f) for f in lists])[:-1])


def keyed_filter(spec: ModelSpec, evaluated: EdgeBucket, known: Sequence[EdgeBucket],
                 sources: Sequence[str]) -> tuple[FilterIndex, EdgeBucket]:
    """The filter index of the ``known`` edges (filtered ranking) and the ``evaluated`` edges, a
    featurized side's entity given in both as its bag's number (:func:`bag_keys`; the rest as
    they are). ``sources`` name the files of ``evaluated`` and ``known``, for a bucket that lacks
    a featurized side's feature lists."""
    buckets = [evaluated, *known]
    ids = {side: [getattr(b, side) for b in buckets] for side in SIDES}
    for side in SIDES:
        featurized = np.array([getattr(r, side) in spec.featurized for r in spec.relations])
        if not featurized.any():
            continue
        bagged = [np.full(len(b), featurized[0]) if spec.dynamic else featurized[b.rel] for b in buckets]
        lists = []
        for bucket, mask, source in zip(buckets, bagged, sources, strict=True):
            features = bucket.features(side)
            if features is None:
                missing = featurized_missing(side, mask)
                if missing is not None:
                    raise FormatError(missing.first(source))
                features = FeatureLists.empty(len(bucket))
            lists.append(features)
        for i, (mask, keys) in enumerate(zip(bagged, bag_keys(*lists), strict=True)):
            ids[side][i] = np.where(mask, keys, ids[side][i])
    index = FilterIndex.from_edges(*((ids["lhs"][i], b.rel, ids["rhs"][i]) for i, b in enumerate(buckets) if i))
    return index, replace(evaluated, lhs=ids["lhs"][0], rhs=ids["rhs"][0])
