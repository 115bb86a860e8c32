"""The validator's walk over an edge bucket, streamed block by block.

Per bucket: HDF5 readability, ``format_version``, datasets, dtypes, shapes and
lengths; featurized offsets invariants; and, when the config and entity counts
are known, index ranges per relation type and side. The rules are decided by
:mod:`pbgio.checks.edges`; this module reads what they need and collects every issue.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from numpy.typing import NDArray

from pbgio import storage
from pbgio.checks import edges as rules
from pbgio.checks import hdf5 as hdf5_rules
from pbgio.checks import layout as layout_rules
from pbgio.errors import FormatError, MissingArtifactError
from pbgio.formats.h5 import BlockReader, check_written, format_version, link_name, open_h5
from pbgio.spec import naming
from pbgio.spec.edges import DATASETS_BY_NAME, INDEX_DATASETS, READ_BLOCK_ELEMENTS, SIDES, Side, data_name, offsets_name
from pbgio.storage import AnyPath
from pbgio.validate.context import Context, RowCollector, absent

Ints = NDArray[np.int64]


def check_edge_path(ctx: Context, edge_path: AnyPath, grid: tuple[int, int],
                    on_bucket: Callable[[str, int], None] | None = None) -> None:
    """Check the bucket files of one edge path against the config's ``grid`` (lhs × rhs partitions):
    the directory is listed once, the buckets found are checked in grid order, the buckets the grid
    lacks are reported each (``edge-file-extra``) and the buckets missing as one issue with their
    count (``edge-file-missing``): the work follows the files, never the grid's size (a config's
    ``num_partitions: 10**7`` is 10^14 buckets)."""
    lhs_parts, rhs_parts = grid
    present: dict[tuple[int, int], AnyPath] = {}
    for path in storage.children(edge_path):
        parsed = naming.parse_bucket_file(path.name)
        if parsed is not None:
            present[parsed] = path

    def in_grid(key: tuple[int, int]) -> bool:
        return key[0] < lhs_parts and key[1] < rhs_parts

    cells = ((lhs, rhs) for lhs in range(lhs_parts) for rhs in range(rhs_parts))
    first, total = absent(cells, present, lhs_parts * rhs_parts, in_grid)
    if total:
        ctx.add(layout_rules.edge_file_missing(ctx.display(edge_path / naming.bucket_file(*first[0])), first[0],
                                               grid, first=first, total=total))
    for key in sorted(k for k in present if in_grid(k)):
        bucket = edge_path / naming.bucket_file(*key)
        if on_bucket is not None:
            on_bucket(ctx.display(bucket), storage.file_size(bucket))
        check_bucket(ctx, bucket, *key)
    for key in sorted(k for k in present if not in_grid(k)):
        ctx.add(layout_rules.edge_file_extra(ctx.display(present[key]), key, grid))


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
    file = ctx.display(path)
    try:
        ctx.add(hdf5_rules.format_version(file, format_version(f)))
    except FormatError as exc:
        ctx.add_error(exc, path)
    datasets: dict[str, Any] = {}
    for raw, item in f.items():
        name = link_name(raw)
        if isinstance(item, h5py.Dataset) and name in DATASETS_BY_NAME:
            datasets[name] = item
        else:
            ctx.add(rules.dataset_unknown(file, name, group=isinstance(item, h5py.Group)))
    missing = rules.missing_datasets(file, list(datasets))
    ctx.extend(missing)
    usable = set()
    for name, ds in datasets.items():
        issues = rules.dataset_issues(file, name, tuple(ds.shape), ds.dtype)
        ctx.extend(issues)
        if rules.usable(issues):
            usable.add(name)
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
        if name in usable:
            issue = rules.length_mismatch(file, name, int(datasets[name].shape[0]), n)
            if issue is not None:
                ctx.add(issue)
                usable.discard(name)
    if not {"lhs", "rhs"} <= usable:
        return
    sides: dict[Side, tuple[Any, Any]] = {}
    for side in SIDES:
        off, dat = offsets_name(side), data_name(side)
        pair = rules.offsets_pair(file, side, list(datasets))
        if pair is not None:
            ctx.add(pair)
        elif off in datasets and off in usable and dat in usable:
            length = rules.offsets_length(file, side, int(datasets[off].shape[0]), n)
            if length is not None:
                ctx.add(length)
            else:
                sides[side] = (datasets[off], datasets[dat])
    if ctx.config is not None:
        ctx.extend(rules.features_unused(file, side, list(datasets), ctx.config) for side in SIDES)
    with contextlib.ExitStack() as files:
        _scan_blocks(ctx, files, path, datasets, usable, sides, n, lhs_part, rhs_part)


class _Reader:
    """Reads blocks of a 1-D dataset into a reused buffer (bounded memory)."""

    def __init__(self, ctx: Context, files: contextlib.ExitStack, slot: str, ds: Any, block: int) -> None:
        self.blocks = files.enter_context(BlockReader(ds, Path(ds.file.filename)))
        self.buf = ctx.buffer(slot, block, ds.dtype.newbyteorder("="))

    def read(self, start: int, end: int) -> NDArray[Any]:
        out = self.buf[: end - start]
        self.blocks.read(start, end, out)
        return out


def _scan_blocks(ctx: Context, files: contextlib.ExitStack, path: AnyPath, datasets: dict[str, Any],
                 usable: set[str], sides: dict[Side, tuple[Any, Any]], n: int, lhs_part: int | None,
                 rhs_part: int | None) -> None:
    block = READ_BLOCK_ELEMENTS
    num_rel = ctx.num_relations
    file = ctx.display(path)
    limits: dict[Side, rules.SideLimits | None] = {"lhs": None, "rhs": None}
    # Dynamic relations: every relation id has the one relation's types, so its limits are held once
    # (a count file's 10^15 relation types are no 10^15 limits) and the rows' ids looked up as id 0.
    same = ctx.config is not None and ctx.config.dynamic_relations
    if num_rel is not None and lhs_part is not None and rhs_part is not None:
        parts: dict[Side, int] = {"lhs": lhs_part, "rhs": rhs_part}
        limits = {side: rules.relation_limits(ctx.config, side, part, min(num_rel, 1) if same else num_rel,
                                              ctx.counts)
                  for side, part in parts.items()}
    readers = {name: _Reader(ctx, files, name, datasets[name], block) for name in INDEX_DATASETS}
    weight = _Reader(ctx, files, "weight", datasets["weight"], block) if "weight" in usable else None
    off_readers = {side: _Reader(ctx, files, offsets_name(side), off, block + 1) for side, (off, _) in sides.items()}

    def collectors() -> dict[Side, RowCollector]:
        return {side: RowCollector(ctx, path) for side in SIDES}

    rel_rows, weight_rows = RowCollector(ctx, path), RowCollector(ctx, path)
    index_rows, order_rows, plain_rows = collectors(), collectors(), collectors()
    missing_rows, feature_rows = collectors(), collectors()
    source = "dynamic_rel_count.txt" if ctx.config is not None and ctx.config.dynamic_relations \
        else "the config's relations"

    for start in range(0, n, block):
        end = min(start + block, n)
        rel = readers["rel"].read(start, end)
        # Rows with an out-of-range rel have no known entity types: only edge-rel-range applies.
        rel_index, known = rel, None
        if num_rel is not None:
            bad_rel = rules.rel_range(rel, num_rel, source)
            if bad_rel is not None:
                rel_rows.add(start, bad_rel)
                rel_index, known = np.clip(rel, 0, max(num_rel - 1, 0)), ~bad_rel.bad
            if same:
                rel_index = np.zeros_like(rel)
        offs = {side: reader.read(start, end + 1) for side, reader in off_readers.items()}
        for side, off in offs.items():
            if start == 0:
                ctx.add(rules.offsets_start(file, side, int(off[0])))
            order_rows[side].add(start + 1, rules.offsets_order(side, off))
        for side in SIDES:
            lim = limits[side]
            if lim is None:
                continue
            index_rows[side].add(start, rules.index_range(side, readers[side].read(start, end), rel_index, lim, known))
            if side in offs:
                _check_bags(side, offs[side], sides[side][1], lim, rel_index, known, start,
                            plain_rows[side], feature_rows[side])
            elif lim.featurized.any() and offsets_name(side) not in datasets:
                need = lim.featurized[rel_index] if known is None else lim.featurized[rel_index] & known
                missing_rows[side].add(start, rules.featurized_missing(side, need))
        if weight is not None:
            weight_rows.add(start, rules.weight_invalid(weight.read(start, end)))
    for side, (off, dat) in sides.items():
        if n == 0:
            ctx.add(rules.offsets_start(file, side, int(off[0])))
        ctx.add(rules.offsets_end(file, side, 0, int(off[n]), int(dat.shape[0]), n, final=True))
        lim = limits[side]
        if lim is not None:
            _check_uniform_feature_ids(ctx, files, side, dat, lim, feature_rows[side])
    for c in (rel_rows, weight_rows, *index_rows.values(), *order_rows.values(), *plain_rows.values(),
              *missing_rows.values(), *feature_rows.values()):
        c.flush()


def _check_bags(side: Side, off: Ints, dat: Any, lim: rules.SideLimits, rel: Ints,
                known: NDArray[np.bool_] | None, start: int, plain_rows: RowCollector,
                feature_rows: RowCollector) -> None:
    """Plain rows need empty bags; with several feature counts, check ids row by row."""
    lengths = off[1:] - off[:-1]
    plain = ~lim.featurized[rel] if known is None else ~lim.featurized[rel] & known
    plain_rows.add(start, rules.plain_features(side, lengths, plain))
    if lim.single_feature_limit is not None or not lim.featurized.any():
        return
    lo, hi = int(off[0]), int(off[-1])
    if hi <= lo or (lengths < 0).any() or lo < 0 or hi > dat.shape[0]:
        return  # broken offsets are reported by the offsets rules
    ids = np.asarray(dat[lo:hi])
    per_row = lim.feature_limit[rel] if known is None else np.where(known, lim.feature_limit[rel], -1)
    feature_rows.add(lo, rules.feature_range(side, ids, np.repeat(per_row, lengths)))


def _check_uniform_feature_ids(ctx: Context, files: contextlib.ExitStack, side: Side, dat: Any,
                               lim: rules.SideLimits, rows: RowCollector) -> None:
    """Stream the feature ids when every featurized relation shares one feature count."""
    bound = lim.single_feature_limit
    if bound is None or bound < 0:
        return
    reader = _Reader(ctx, files, "features", dat, READ_BLOCK_ELEMENTS)
    total = dat.shape[0]
    for start in range(0, total, READ_BLOCK_ELEMENTS):
        rows.add(start, rules.feature_range(side, reader.read(start, min(start + READ_BLOCK_ELEMENTS, total)), bound))
