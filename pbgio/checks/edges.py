"""The rules of edge buckets, over what a reader or the validator has read of a bucket.

Structure (datasets, dtypes, shapes, lengths, offsets beside data) is decided on metadata; values
(index ranges, weights, offsets, feature ids) on blocks of rows, as :class:`~pbgio.checks.RowProblem`
objects: the validator streams a bucket block by block and accumulates them, a reader raises
the first (:func:`pbgio.checks.raise_first`), and :func:`check_bounds` is the fail-fast form of
the range rules a trainer applies to every bucket it reads.

>>> print(dataset_missing("edges_0_0.h5", "rhs"))
edges_0_0.h5: rhs: expected dataset rhs, found none [edge-dataset-missing]
>>> [i.rule for i in dataset_issues("edges_0_0.h5", "weight", (4,), np.dtype(np.int64))]
['edge-weight-int']
>>> print(offsets_order("lhs", np.array([0, 2, 1, 3])).first("edges_0_0.h5", offset=1))
edges_0_0.h5: lhsd_offsets: row 2: expected non-decreasing offsets, found 1 after 2 [edge-offsets-order]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from pbgio.checks import RowProblem, is_int64, raise_first, row_problem
from pbgio.errors import Issue
from pbgio.spec.config import ConfigSchema
from pbgio.spec.edges import DATASETS_BY_NAME, INDEX_DATASETS, Side, data_name, offsets_name
from pbgio.spec.rules import rule

Ints = NDArray[np.int64]
Mask = NDArray[np.bool_]


class FeatureBags(Protocol):
    """Bags of feature ids (:class:`pbgio.edges.FeatureLists`)."""

    offsets: Ints
    data: Ints


class Edges(Protocol):
    """Edges read from a bucket (:class:`pbgio.edges.EdgeBucket`)."""

    rel: Ints
    lhs: Ints
    rhs: Ints

    def __len__(self) -> int: ...

    def features(self, side: Side) -> FeatureBags | None: ...


# --------------------------------------------------------------------------- structure


def dataset_unknown(file: str | None, name: str, *, group: bool) -> Issue:
    """``edge-dataset-unknown``: a member ``name`` of the bucket that is not an edge dataset (a
    group, or a dataset of another name)."""
    return rule("edge-dataset-unknown").issue(
        file, name, "expected only rel, lhs, rhs, weight, lhsd_/rhsd_ offsets and data, found this "
        + ("group" if group else "dataset"))


def dataset_missing(file: str | None, name: str) -> Issue:
    """``edge-dataset-missing``: required dataset ``name`` (rel, lhs or rhs) is absent."""
    return rule("edge-dataset-missing").issue(file, name, f"expected dataset {name}, found none")


def missing_datasets(file: str | None, names: Sequence[str]) -> list[Issue]:
    """``edge-dataset-missing`` for each of rel, lhs and rhs that ``names`` lacks."""
    return [dataset_missing(file, name) for name in INDEX_DATASETS if name not in names]


def dataset_issues(file: str | None, name: str, shape: tuple[int, ...] | None, dtype: np.dtype[Any] | None,
                   kind: str = "Dataset") -> list[Issue]:
    """``edge-dataset-shape``, ``edge-dataset-dtype`` and ``edge-weight-int`` of edge dataset
    ``name`` of ``shape`` and ``dtype`` (both None: the member is a ``kind``, not a dataset).
    An empty list, or only the ``edge-weight-int`` warning, means the dataset is usable."""
    if shape is None or dtype is None:
        return [rule("edge-dataset-shape").issue(file, name, f"expected a 1-D dataset, found a {kind}")]
    issues = []
    if len(shape) != 1:
        issues.append(rule("edge-dataset-shape").issue(file, name, f"expected 1 dimension, found shape {shape}"))
    if name == "weight":
        if np.issubdtype(dtype, np.integer):
            issues.append(rule("edge-weight-int").issue(
                file, name, f"expected float weights, found {dtype} (the original's importer truncated "
                "float weights to integers)"))
        elif not np.issubdtype(dtype, np.floating):
            issues.append(rule("edge-dataset-dtype").issue(file, name, f"expected a float dtype, found {dtype}"))
    elif not is_int64(dtype):
        issues.append(rule("edge-dataset-dtype").issue(
            file, name, f"expected {DATASETS_BY_NAME[name].dtype}, found {dtype}"))
    return issues


def usable(issues: Sequence[Issue]) -> bool:
    """Whether a dataset whose :func:`dataset_issues` are ``issues`` can be read as edges."""
    return all(issue.severity == "warning" for issue in issues)


def length_mismatch(file: str | None, name: str, length: int, num_edges: int) -> Issue | None:
    """``edge-length-mismatch``: dataset ``name`` (lhs, rhs, weight) has ``length`` entries for
    the ``num_edges`` of rel."""
    if length == num_edges:
        return None
    return rule("edge-length-mismatch").issue(
        file, name, f"expected {num_edges} entries (the length of rel), found {length}")


def offsets_pair(file: str | None, side: Side, names: Sequence[str]) -> Issue | None:
    """``edge-offsets-pair``: a bucket with member ``names`` has both or neither of ``side``'s
    offsets and data."""
    off, dat = offsets_name(side), data_name(side)
    if (off in names) == (dat in names):
        return None
    have, lack = (off, dat) if off in names else (dat, off)
    return rule("edge-offsets-pair").issue(file, lack, f"expected {lack} beside {have}, found none")


def offsets_length(file: str | None, side: Side, length: int, num_edges: int) -> Issue | None:
    """``edge-offsets-length``: ``side``'s offsets have N + 1 entries for N edges."""
    if length == num_edges + 1:
        return None
    return rule("edge-offsets-length").issue(
        file, offsets_name(side), f"expected {num_edges + 1} entries (N + 1 for N = {num_edges} edges), "
        f"found {length}")


def features_unused(file: str | None, side: Side, names: Sequence[str], cfg: ConfigSchema) -> Issue | None:
    """``edge-features-unused``: ``side``'s feature datasets among ``names`` while no relation of
    ``cfg`` has a featurized ``side`` type (flag ↔ datasets)."""
    present = [name for name in (offsets_name(side), data_name(side)) if name in names]
    types = {getattr(rel, side) for rel in cfg.relations}
    if not present or any(t in cfg.entities and cfg.entities[t].featurized for t in types):
        return None
    return rule("edge-features-unused").issue(
        file, present[0], f"expected no {side}d_* datasets: no relation has a featurized {side} type "
        f"({', '.join(sorted(types))}), found {', '.join(present)} (ignored when training)")


# --------------------------------------------------------------------------- offsets


def offsets_start(file: str | None, side: Side, first: int) -> Issue | None:
    """``edge-offsets-start``: ``side``'s offsets start at 0."""
    if first == 0:
        return None
    return rule("edge-offsets-start").issue(file, offsets_name(side), f"expected 0, found {first}", rows=(0,), count=1)


def offsets_order(side: Side, off: Ints) -> RowProblem | None:
    """``edge-offsets-order``: offsets (a block of them, the first one already checked against
    the previous block) are non-decreasing; row ``i`` of the problem is entry ``i + 1``."""
    return row_problem("edge-offsets-order", offsets_name(side), off[1:] < off[:-1],
                       lambda i: f"expected non-decreasing offsets, found {off[i + 1]} after {off[i]}")


def offsets_end(file: str | None, side: Side, first: int, last: int, data_length: int, row: int, *,
                final: bool) -> Issue | None:
    """``edge-offsets-end``: offsets ``first``..``last`` (ending at entry ``row``) cut
    ``side``'s data of ``data_length`` entries: the final offset equals it (``final``), and any
    offsets lie within it (a reader of a chunk, which knows its offsets only)."""
    if final and last != data_length:
        message = f"expected {data_length} (len({data_name(side)})), found {last}"
    elif not 0 <= first <= last <= data_length:
        message = f"expected offsets within [0, {data_length}] (len({data_name(side)})), found {first} to {last}"
    else:
        return None
    return rule("edge-offsets-end").issue(file, offsets_name(side), message, rows=(row,), count=1)


# --------------------------------------------------------------------------- values


@dataclass
class SideLimits:
    """Per relation id: the entity count bounding a side's index, and whether it is featurized."""

    limit: Ints  # -1 where unknown (count file missing)
    featurized: Mask
    feature_limit: Ints  # feature count where featurized, -1 otherwise
    labels: list[str]  # "'user' partition 1", the count file each limit comes from

    @property
    def uniform_plain_limit(self) -> int | None:
        """The one limit when every relation is plain and shares it, else None."""
        if len(self.limit) and not self.featurized.any() and (self.limit == self.limit[0]).all():
            return int(self.limit[0])
        return None

    @property
    def single_feature_limit(self) -> int | None:
        """The one feature count of the featurized relations when they share one, else None."""
        found = set(self.feature_limit[self.featurized].tolist())
        return found.pop() if len(found) == 1 else None


def relation_limits(cfg: ConfigSchema | None, side: Side, part: int, num_relations: int,
                    counts: Mapping[tuple[str, int], int]) -> SideLimits | None:
    """The limits of ``side``'s ids in a bucket whose ``side`` partition is ``part``, per relation
    id, from ``counts`` by (entity type, partition) (an unpartitioned type's is partition 0); None
    without a config, or when a relation names a type the config lacks."""
    if cfg is None or num_relations <= 0:
        return None
    rels = [cfg.relations[0]] * num_relations if cfg.dynamic_relations else cfg.relations
    limit = np.full(num_relations, -1, dtype=np.int64)
    featurized = np.zeros(num_relations, dtype=bool)
    feature_limit = np.full(num_relations, -1, dtype=np.int64)
    labels = []
    for r, rel in enumerate(rels):
        etype = getattr(rel, side)
        if etype not in cfg.entities:
            return None
        type_part = part if cfg.entities[etype].num_partitions > 1 else 0
        count = counts.get((etype, type_part))
        labels.append(f"{etype!r} partition {type_part}")
        if cfg.entities[etype].featurized:
            featurized[r] = True
            feature_limit[r] = -1 if count is None else count
        else:
            limit[r] = -1 if count is None else count
    return SideLimits(limit, featurized, feature_limit, labels)


def rel_range(rel: Ints, num_relations: int, source: str | None = None) -> RowProblem | None:
    """``edge-rel-range``: 0 <= rel < ``num_relations`` (counted from ``source``, when named)."""
    if len(rel) == 0 or (int(rel.min()) >= 0 and int(rel.max()) < num_relations):
        return None
    where = f" ({source})" if source else ""
    return row_problem("edge-rel-range", "rel", (rel < 0) | (rel >= num_relations),
                       lambda i: f"expected 0 <= rel < {num_relations}{where}, found {rel[i]}")


def index_range(side: Side, ids: Ints, rel: Ints, lim: SideLimits, known: Mask | None = None) -> RowProblem | None:
    """``edge-lhs-range`` / ``edge-rhs-range``: plain rows have 0 <= id < the count of their
    relation's type; ``rel`` is in range wherever ``known`` (None: everywhere) is true, the rows
    it marks false are left to ``edge-rel-range``."""
    rule_id = {"lhs": "edge-lhs-range", "rhs": "edge-rhs-range"}[side]
    uniform = lim.uniform_plain_limit
    if uniform is not None:
        if uniform < 0 or len(ids) == 0 or int(ids.view(np.uint64).max()) < uniform:  # negatives wrap to huge
            return None
        bad = (ids < 0) | (ids >= uniform)
        if known is not None:
            bad &= known
        bound = np.int64(uniform)
        return row_problem(rule_id, side, bad,
                           lambda i: f"expected 0 <= {side} < {bound} (count of {lim.labels[0]}), found {ids[i]}")
    if lim.featurized.all():
        return None
    row_limit = lim.limit[rel]
    checked = ~lim.featurized[rel] & (row_limit >= 0)
    if known is not None:
        checked &= known
    return row_problem(rule_id, side, checked & ((ids < 0) | (ids >= row_limit)),
                       lambda i: f"expected 0 <= {side} < {row_limit[i]} (count of {lim.labels[rel[i]]}, "
                       f"rel {rel[i]}), found {ids[i]}")


def plain_features(side: Side, lengths: Ints, plain: Mask) -> RowProblem | None:
    """``edge-plain-features``: rows whose ``side`` entity is ``plain`` have empty feature lists
    (of ``lengths``)."""
    return row_problem("edge-plain-features", offsets_name(side), plain & (lengths != 0),
                       lambda i: f"expected an empty feature list for a plain {side} entity, found {lengths[i]} "
                       "features")


def featurized_missing(side: Side, need: Mask) -> RowProblem | None:
    """``edge-featurized-missing``: rows whose ``side`` type is featurized (``need``), in a bucket
    without ``side``'s feature datasets."""
    return row_problem("edge-featurized-missing", offsets_name(side), need,
                       lambda _: f"expected {offsets_name(side)} and {data_name(side)} for this edge, whose "
                       f"{side} type is featurized, found no such datasets")


def feature_range(side: Side, ids: Ints, limits: Ints | int) -> RowProblem | None:
    """``edge-feature-range``: feature ids lie in [0, the feature count): ``limits`` per id (-1:
    unknown, not checked), or one for all."""
    if isinstance(limits, int):
        if len(ids) == 0 or (int(ids.min()) >= 0 and int(ids.max()) < limits):
            return None
        bound = limits
        return row_problem("edge-feature-range", data_name(side), (ids < 0) | (ids >= bound),
                           lambda i: f"expected 0 <= feature id < {bound} (feature count), found {ids[i]}")
    return row_problem("edge-feature-range", data_name(side), (limits >= 0) & ((ids < 0) | (ids >= limits)),
                       lambda i: f"expected 0 <= feature id < {limits[i]} (feature count), found {ids[i]}")


def weight_invalid(weight: NDArray[Any]) -> RowProblem | None:
    """``edge-weight-invalid``: every weight is finite and non-negative."""
    return row_problem("edge-weight-invalid", "weight", ~np.isfinite(weight) | (weight < 0),
                       lambda i: f"expected a finite non-negative weight, found {weight[i]}")


def check_bounds(edges: Edges, path: object, *, first_row: int, lhs: SideLimits, rhs: SideLimits) -> None:
    """Raise the first edge of ``edges`` (read from ``path``, file row ``first_row`` onwards) whose
    rel, plain entity id or feature id lies outside its table, as a :class:`FormatError` naming
    the file, dataset, row and rule (``edge-rel-range``, ``edge-lhs-range``, ``edge-rhs-range``,
    ``edge-feature-range``): the fail-fast form of the validator's range rules, over edges already
    read, with the same limits (:func:`relation_limits`; unknown counts, -1, are not checked). A
    trainer calls it on every bucket it reads, so a bad id never reaches an indexing kernel.
    Featurized ids are checked where the bucket has the side's feature bags.

    >>> from pathlib import Path
    >>> from pbgio.edges import EdgeBucket
    >>> from pbgio.spec.edges import SIDES
    >>> from pbgio.example import example_config
    >>> cfg = example_config()
    >>> counts = {("user", 0): 3, ("user", 1): 3, ("item", 0): 4}
    >>> limits = {s: relation_limits(cfg, s, 0, len(cfg.relations), counts) for s in SIDES}
    >>> bucket = EdgeBucket(rel=np.array([0, 0]), lhs=np.array([1, 5]), rhs=np.array([0, 0]))
    >>> check_bounds(bucket, Path("edges_0_0.h5"), first_row=10, **limits)
    Traceback (most recent call last):
    pbgio.errors.FormatError: edges_0_0.h5: lhs: row 11: expected 0 <= lhs < 3 (count of ...), found 5 [edge-lhs-range]
    """
    if len(edges) == 0:
        return
    file, rel = str(path), edges.rel
    problem = rel_range(rel, len(lhs.limit))
    raise_first([problem.first(file, first_row) if problem else None])
    sides: tuple[tuple[Side, SideLimits], ...] = (("lhs", lhs), ("rhs", rhs))
    for side, lim in sides:
        problem = index_range(side, edges.lhs if side == "lhs" else edges.rhs, rel, lim)
        raise_first([problem.first(file, first_row) if problem else None])
        bags = edges.features(side)
        if bags is None:
            continue
        problem = feature_range(side, bags.data, np.repeat(lim.feature_limit[rel], np.diff(bags.offsets)))
        if problem is not None:
            edge = first_row + int(np.searchsorted(bags.offsets, problem.rows()[0], side="right")) - 1
            i = int(problem.rows()[0])
            raise_first([problem.issue(file, f"{problem.describe(i)} in the features of edge row {edge}", (edge,),
                                       int(problem.bad.sum()))])
