"""Checks of edge buckets, streamed block by block.

Per bucket: HDF5 readability, ``format_version``, datasets, dtypes, shapes and
lengths; featurized offsets invariants; and, when the config and entity counts
are known, index ranges per relation type and side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from numpy.typing import NDArray

from pbgio.checks import Context, RowCollector
from pbgio.config import ConfigSchema
from pbgio.edges import EdgeBucket
from pbgio.errors import FormatError, MissingArtifactError
from pbgio.formats.h5 import BlockReader, check_format_version, check_written, is_int64, link_name, open_h5
from pbgio.spec.edges import (
    DATASETS_BY_NAME,
    INDEX_DATASETS,
    READ_BLOCK_ELEMENTS,
    SIDES,
    Side,
    data_name,
    offsets_name,
)
from pbgio.spec.rules import rule
from pbgio.storage import AnyPath

Ints = NDArray[np.int64]


@dataclass
class SideLimits:
    """Per relation id: the entity count bounding a side's index, and whether it is featurized."""

    limit: Ints  # -1 where unknown (count file missing)
    featurized: NDArray[np.bool_]
    feature_limit: Ints  # feature count where featurized, -1 otherwise
    labels: list[str]  # "'user' partition 1", the count file each limit comes from

    @property
    def uniform_plain_limit(self) -> int | None:
        """The one limit when every relation is plain and shares it, else None."""
        if len(self.limit) and not self.featurized.any() and (self.limit == self.limit[0]).all():
            return int(self.limit[0])
        return None


def side_limits(ctx: Context, side: Side, part: int, num_relations: int) -> SideLimits | None:
    return relation_limits(ctx.config, side, part, num_relations, ctx.counts)


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


def check_bounds(edges: EdgeBucket, path: AnyPath, *, first_row: int, lhs: SideLimits, rhs: SideLimits) -> None:
    """Raise the first edge of ``edges`` (read from ``path``, file row ``first_row`` onwards) whose
    rel, plain entity id or feature id lies outside its table, as a :class:`FormatError` naming
    the file, dataset, row and rule (``edge-rel-range``, ``edge-lhs-range``, ``edge-rhs-range``,
    ``edge-feature-range``): the fail-fast form of the validator's range rules, over edges already
    read, with the same limits (:func:`relation_limits`; unknown counts, -1, are not checked). A
    trainer calls it on every bucket it reads, so a bad id never reaches an indexing kernel.
    Featurized ids are checked where the bucket has the side's feature bags.

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
    rel, num_relations = edges.rel, len(lhs.limit)
    bad = (rel < 0) | (rel >= num_relations)
    if bad.any():
        i = int(np.argmax(bad))
        raise FormatError(rule("edge-rel-range").issue(
            str(path), "rel", f"expected 0 <= rel < {num_relations}, found {rel[i]}", rows=(first_row + i,),
            count=int(bad.sum())))
    sides: tuple[tuple[Side, SideLimits], ...] = (("lhs", lhs), ("rhs", rhs))
    for side, lim in sides:
        ids = edges.lhs if side == "lhs" else edges.rhs
        row_limit = lim.limit[rel]
        bad = ~lim.featurized[rel] & (row_limit >= 0) & ((ids < 0) | (ids >= row_limit))
        if bad.any():
            i = int(np.argmax(bad))
            raise FormatError(rule(f"edge-{side}-range").issue(
                str(path), side, f"expected 0 <= {side} < {row_limit[i]} (count of {lim.labels[rel[i]]}), "
                f"found {ids[i]}", rows=(first_row + i,), count=int(bad.sum())))
        bags = edges.features(side)
        if bags is None:
            continue
        sizes = np.diff(bags.offsets)
        feature_limit = np.repeat(lim.feature_limit[rel], sizes)
        bad = (feature_limit >= 0) & ((bags.data < 0) | (bags.data >= feature_limit))
        if bad.any():
            i = int(np.argmax(bad))
            edge = first_row + int(np.searchsorted(bags.offsets, i, side="right")) - 1
            raise FormatError(rule("edge-feature-range").issue(
                str(path), data_name(side), f"expected 0 <= feature id < {feature_limit[i]} (feature count), "
                f"found {bags.data[i]} in the features of edge row {edge}", rows=(edge,), count=int(bad.sum())))


def check_bucket(ctx: Context, path: AnyPath, lhs_part: int | None = None, rhs_part: int | None = None) -> None:
    """Check one bucket file; partitions are needed for range checks against the config."""
    try:
        with open_h5(path if ctx.cache is None else ctx.cache.local(path)) as f:
            _check_open_bucket(ctx, path, f, lhs_part, rhs_part)
    except (FormatError, MissingArtifactError) as exc:
        ctx.add_error(exc, path)
    ctx.report.count_checked("bucket files")


def _check_open_bucket(ctx: Context, path: AnyPath, f: h5py.File, lhs_part: int | None,
                       rhs_part: int | None) -> None:
    try:
        check_format_version(f, path)
    except FormatError as exc:
        ctx.add_error(exc, path)
    datasets: dict[str, Any] = {}
    for raw, item in f.items():
        name = link_name(raw)
        if isinstance(item, h5py.Dataset) and name in DATASETS_BY_NAME:
            datasets[name] = item
        else:
            ctx.add("edge-dataset-unknown", path, name,
                    "expected only rel, lhs, rhs, weight, lhsd_/rhsd_ offsets and data, found this "
                    + ("group" if isinstance(item, h5py.Group) else "dataset"))
    missing = [n for n in INDEX_DATASETS if n not in datasets]
    for name in missing:
        ctx.add("edge-dataset-missing", path, name, f"expected dataset {name}, found none")
    usable = _check_dtypes_and_shapes(ctx, path, datasets)
    if missing or not {*INDEX_DATASETS} <= usable:
        return
    unwritten = False
    for name in sorted(usable):
        try:
            check_written(datasets[name], path)
        except FormatError as exc:
            ctx.add_error(exc, path)
            unwritten = True
    if unwritten:
        return  # nothing to scan: the claimed rows are not in the file
    n = int(datasets["rel"].shape[0])
    ctx.report.count_checked("edges", n)
    ctx.report.count_checked("bucket bytes", sum(int(datasets[k].id.get_storage_size()) for k in INDEX_DATASETS))
    for name in ("lhs", "rhs", "weight"):
        if name in usable and datasets[name].shape[0] != n:
            ctx.add("edge-length-mismatch", path, name,
                    f"expected {n} entries (the length of rel), found {datasets[name].shape[0]}")
            usable.discard(name)
    if not {"lhs", "rhs"} <= usable:
        return
    sides: dict[Side, tuple[Any, Any]] = {}
    for side in SIDES:
        off, dat = offsets_name(side), data_name(side)
        if (off in datasets) != (dat in datasets):
            have, lack = (off, dat) if off in datasets else (dat, off)
            ctx.add("edge-offsets-pair", path, lack, f"expected {lack} beside {have}, found none")
        elif off in datasets and off in usable and dat in usable:
            if datasets[off].shape[0] != n + 1:
                ctx.add("edge-offsets-length", path, off,
                        f"expected {n + 1} entries (N + 1 for N = {n} edges), found {datasets[off].shape[0]}")
            else:
                sides[side] = (datasets[off], datasets[dat])
    _check_unused_features(ctx, path, datasets)
    _scan(ctx, path, datasets, usable, sides, n, lhs_part, rhs_part)


def _check_unused_features(ctx: Context, path: AnyPath, datasets: dict[str, Any]) -> None:
    """Feature datasets on a side where the config has no featurized type (flag ↔ datasets)."""
    cfg = ctx.config
    if cfg is None:
        return
    for side in SIDES:
        present = [name for name in (offsets_name(side), data_name(side)) if name in datasets]
        types = {getattr(rel, side) for rel in cfg.relations}
        if present and not any(t in cfg.entities and cfg.entities[t].featurized for t in types):
            ctx.add("edge-features-unused", path, present[0],
                    f"expected no {side}d_* datasets: no relation has a featurized {side} type "
                    f"({', '.join(sorted(types))}), found {', '.join(present)} (ignored when training)")


def _check_dtypes_and_shapes(ctx: Context, path: AnyPath, datasets: dict[str, Any]) -> set[str]:
    usable = set()
    for name, ds in datasets.items():
        ok = True
        if ds.ndim != 1:
            ctx.add("edge-dataset-shape", path, name, f"expected 1 dimension, found shape {ds.shape}")
            ok = False
        if name == "weight":
            if np.issubdtype(ds.dtype, np.integer):
                ctx.add("edge-weight-int", path, name,
                        f"expected float weights, found {ds.dtype} (the original's importer truncated "
                        "float weights to integers)")
            elif not np.issubdtype(ds.dtype, np.floating):
                ctx.add("edge-dataset-dtype", path, name, f"expected a float dtype, found {ds.dtype}")
                ok = False
        elif not is_int64(ds.dtype):
            ctx.add("edge-dataset-dtype", path, name,
                    f"expected {DATASETS_BY_NAME[name].dtype}, found {ds.dtype}")
            ok = False
        if ok:
            usable.add(name)
    return usable


class _Reader:
    """Reads blocks of a 1-D dataset into a reused buffer (bounded memory)."""

    def __init__(self, ctx: Context, files: contextlib.ExitStack, slot: str, ds: Any, block: int) -> None:
        self.blocks = files.enter_context(BlockReader(ds, Path(ds.file.filename)))
        self.buf = ctx.buffer(slot, block, ds.dtype.newbyteorder("="))

    def read(self, start: int, end: int) -> NDArray[Any]:
        out = self.buf[: end - start]
        self.blocks.read(start, end, out)
        return out


def _scan(ctx: Context, path: AnyPath, datasets: dict[str, Any], usable: set[str],
          sides: dict[Side, tuple[Any, Any]], n: int, lhs_part: int | None, rhs_part: int | None) -> None:
    with contextlib.ExitStack() as files:
        _scan_blocks(ctx, files, path, datasets, usable, sides, n, lhs_part, rhs_part)


def _scan_blocks(ctx: Context, files: contextlib.ExitStack, path: AnyPath, datasets: dict[str, Any],
                 usable: set[str], sides: dict[Side, tuple[Any, Any]], n: int, lhs_part: int | None,
                 rhs_part: int | None) -> None:
    block = READ_BLOCK_ELEMENTS
    num_rel = ctx.num_relations
    limits: dict[Side, SideLimits | None] = {"lhs": None, "rhs": None}
    if num_rel is not None and lhs_part is not None and rhs_part is not None:
        limits = {"lhs": side_limits(ctx, "lhs", lhs_part, num_rel),
                  "rhs": side_limits(ctx, "rhs", rhs_part, num_rel)}
    readers = {name: _Reader(ctx, files, name, datasets[name], block) for name in INDEX_DATASETS}
    weight = _Reader(ctx, files, "weight", datasets["weight"], block) if "weight" in usable else None
    off_readers = {side: _Reader(ctx, files, offsets_name(side), off, block + 1) for side, (off, _) in sides.items()}

    def collector(rule_id: str, dataset: str) -> RowCollector:
        return RowCollector(ctx, rule_id, path, dataset)

    rel_rows = collector("edge-rel-range", "rel")
    index_rows = {side: collector(f"edge-{side}-range", side) for side in SIDES}
    order_rows = {side: collector("edge-offsets-order", offsets_name(side)) for side in SIDES}
    plain_rows = {side: collector("edge-plain-features", offsets_name(side)) for side in SIDES}
    missing_rows = {side: collector("edge-featurized-missing", offsets_name(side)) for side in SIDES}
    feature_rows = {side: collector("edge-feature-range", data_name(side)) for side in SIDES}
    weight_rows = collector("edge-weight-invalid", "weight")

    for start in range(0, n, block):
        end = min(start + block, n)
        rel = readers["rel"].read(start, end)
        # Rows with an out-of-range rel have no known entity types: only edge-rel-range applies.
        rel_index, known = rel, None
        if num_rel is not None and (int(rel.min()) < 0 or int(rel.max()) >= num_rel):
            bad_rel = (rel < 0) | (rel >= num_rel)
            if (i := rel_rows.add(start, bad_rel)) is not None:
                rel_rows.describe(f"expected 0 <= rel < {num_rel} ({_rel_source(ctx)}), found {rel[i]}")
            rel_index, known = np.clip(rel, 0, max(num_rel - 1, 0)), ~bad_rel
        offs = {side: reader.read(start, end + 1) for side, reader in off_readers.items()}
        for side, off in offs.items():
            if start == 0 and off[0] != 0:
                ctx.add("edge-offsets-start", path, offsets_name(side), f"expected 0, found {off[0]}",
                        rows=(0,), count=1)
            if (i := order_rows[side].add(start + 1, off[1:] < off[:-1])) is not None:
                order_rows[side].describe(
                    f"expected non-decreasing offsets, found {off[i + 1]} after {off[i]}"
                )
        for side in SIDES:
            lim = limits[side]
            if lim is None:
                continue
            _check_indices(readers[side].read(start, end), rel_index, known, lim, index_rows[side],
                           start, side)
            if side in offs:
                _check_bags(side, offs[side], sides[side][1], lim, rel_index, known, start,
                            plain_rows[side], feature_rows[side])
            elif lim.featurized.any() and offsets_name(side) not in datasets:
                need = lim.featurized[rel_index] if known is None else lim.featurized[rel_index] & known
                if (i := missing_rows[side].add(start, need)) is not None:
                    missing_rows[side].describe(
                        f"expected {offsets_name(side)} and {data_name(side)} for this edge, whose "
                        f"{side} type is featurized, found no such datasets"
                    )
        if weight is not None:
            w = weight.read(start, end)
            bad_w = ~np.isfinite(w) | (w < 0)
            if bad_w.any():
                if (i := weight_rows.add(start, bad_w)) is not None:
                    weight_rows.describe(
                        f"expected a finite non-negative weight, found {w[i]}"
                    )
    for side, (off, dat) in sides.items():
        if n == 0 and int(off[0]) != 0:
            ctx.add("edge-offsets-start", path, offsets_name(side), f"expected 0, found {off[0]}",
                    rows=(0,), count=1)
        last = int(off[n])
        if last != dat.shape[0]:
            ctx.add("edge-offsets-end", path, offsets_name(side),
                    f"expected {dat.shape[0]} (len({data_name(side)})), found {last}", rows=(n,), count=1)
        lim = limits[side]
        if lim is not None:
            _check_uniform_feature_ids(ctx, files, dat, lim, feature_rows[side])
    for c in (rel_rows, weight_rows, *index_rows.values(), *order_rows.values(), *plain_rows.values(),
              *missing_rows.values(), *feature_rows.values()):
        c.flush()


def _rel_source(ctx: Context) -> str:
    if ctx.config is not None and ctx.config.dynamic_relations:
        return "dynamic_rel_count.txt"
    return "the config's relations"


def _check_indices(idx: Ints, rel: Ints, known: NDArray[np.bool_] | None, lim: SideLimits,
                   collector: RowCollector, start: int, side: str) -> None:
    """Plain rows: 0 <= index < count; ``known`` masks rows whose rel is in range (None: all)."""
    uniform = lim.uniform_plain_limit
    if uniform is not None:
        if uniform < 0:
            return
        if int(idx.view(np.uint64).max()) < uniform:  # negatives wrap to huge values
            return
        bad = (idx < 0) | (idx >= uniform)
        if known is not None:
            bad &= known
        bound = np.int64(uniform)
        if (i := collector.add(start, bad)) is not None:
            collector.describe(
                f"expected 0 <= {side} < {bound} (count of {lim.labels[0]}), found {idx[i]}"
            )
        return
    if lim.featurized.all():
        return
    row_limit = lim.limit[rel]
    checked = ~lim.featurized[rel] & (row_limit >= 0)
    if known is not None:
        checked &= known
    bad = checked & ((idx < 0) | (idx >= row_limit))
    if bad.any():
        if (i := collector.add(start, bad)) is not None:
            collector.describe(
                f"expected 0 <= {side} < {row_limit[i]} (count of {lim.labels[rel[i]]}, rel {rel[i]}), "
                f"found {idx[i]}"
            )


def _check_bags(side: str, off: Ints, dat: Any, lim: SideLimits, rel: Ints,
                known: NDArray[np.bool_] | None, start: int, plain_rows: RowCollector,
                feature_rows: RowCollector) -> None:
    """Plain rows need empty bags; with several feature counts, check ids row by row."""
    lengths = off[1:] - off[:-1]
    plain = ~lim.featurized[rel] if known is None else ~lim.featurized[rel] & known
    bad = plain & (lengths != 0)
    if bad.any():
        if (i := plain_rows.add(start, bad)) is not None:
            plain_rows.describe(
                f"expected an empty feature list for a plain {side} entity, found {lengths[i]} features"
            )
    if _single_feature_limit(lim) is not None or not lim.featurized.any():
        return
    lo, hi = int(off[0]), int(off[-1])
    if hi <= lo or (lengths < 0).any() or lo < 0 or hi > dat.shape[0]:
        return  # broken offsets are reported by the offsets rules
    ids = np.asarray(dat[lo:hi])
    per_row = lim.feature_limit[rel] if known is None else np.where(known, lim.feature_limit[rel], -1)
    row_limits = np.repeat(per_row, lengths)
    bad_ids = (row_limits >= 0) & ((ids < 0) | (ids >= row_limits))
    if (i := feature_rows.add(lo, bad_ids)) is not None:
        feature_rows.describe(
            f"expected 0 <= feature id < {row_limits[i]} (feature count), found {ids[i]}"
        )


def _single_feature_limit(lim: SideLimits) -> int | None:
    found = set(lim.feature_limit[lim.featurized].tolist())
    return found.pop() if len(found) == 1 else None


def _check_uniform_feature_ids(ctx: Context, files: contextlib.ExitStack, dat: Any, lim: SideLimits,
                               rows: RowCollector) -> None:
    """Stream the feature ids when every featurized relation shares one feature count."""
    bound = _single_feature_limit(lim)
    if bound is None or bound < 0:
        return
    reader = _Reader(ctx, files, "features", dat, READ_BLOCK_ELEMENTS)
    total = dat.shape[0]
    for start in range(0, total, READ_BLOCK_ELEMENTS):
        ids = reader.read(start, min(start + READ_BLOCK_ELEMENTS, total))
        if int(ids.min()) < 0 or int(ids.max()) >= bound:
            if (i := rows.add(start, (ids < 0) | (ids >= bound))) is not None:
                rows.describe(
                    f"expected 0 <= feature id < {bound} (feature count), found {ids[i]}"
                )
