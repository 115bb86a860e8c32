"""Read and write edge buckets ``edges_{lhs}_{rhs}.h5``.

>>> import tempfile, pathlib, numpy as np
>>> path = pathlib.Path(tempfile.mkdtemp()) / "edges_0_0.h5"
>>> bucket = EdgeBucket(rel=np.array([0, 1, 0]), lhs=np.array([2, 0, 1]), rhs=np.array([1, 1, 0]))
>>> write_bucket(path, bucket)
>>> bucket_length(path)
3
>>> read_bucket(path, chunk=(0, 2)).lhs.tolist()  # chunk 0 of 2: edges [0, 2)
[2, 0]

Large buckets stream through :class:`BucketWriter`, which buffers and appends:

>>> with BucketWriter(path) as writer:
...     for _ in range(4):
...         writer.append(bucket)
>>> bucket_length(path)
12
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import h5py
import numpy as np
from numpy.typing import NDArray

from pbgio import confinement, storage
from pbgio.checks import edges as checks
from pbgio.checks import raise_first
from pbgio.formats.h5 import BlockReader, check_format_version, check_written, open_h5, write_format_version
from pbgio.spec.edges import (
    INDEX_DATASETS,
    SIDES,
    WRITE_CHUNK_ELEMENTS,
    Side,
    chunk_bounds,
    data_name,
    offsets_name,
)
from pbgio.storage import AnyPath, atomic

Int64Array = NDArray[np.int64]


@dataclass
class FeatureLists:
    """Bags of feature ids: bag ``i`` is ``data[offsets[i]:offsets[i+1]]``."""

    offsets: Int64Array
    data: Int64Array

    @classmethod
    def from_lists(cls, bags: list[list[int]]) -> FeatureLists:
        lengths = np.array([len(b) for b in bags], dtype=np.int64)
        offsets = np.zeros(len(bags) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.array([x for b in bags for x in b], dtype=np.int64)
        return cls(offsets, data)

    @classmethod
    def empty(cls, n: int) -> FeatureLists:
        return cls(np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def bag(self, i: int) -> Int64Array:
        return self.data[self.offsets[i]:self.offsets[i + 1]]

    def to_lists(self) -> list[list[int]]:
        return [self.bag(i).tolist() for i in range(len(self))]

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, FeatureLists) and np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.data, other.data))


@dataclass
class EdgeBucket:
    """Edges of one bucket in memory (or one chunk of it)."""

    rel: Int64Array
    lhs: Int64Array
    rhs: Int64Array
    weight: NDArray[np.floating[Any]] | None = None
    lhs_features: FeatureLists | None = None
    rhs_features: FeatureLists | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.rel = np.asarray(self.rel, dtype=np.int64)
        self.lhs = np.asarray(self.lhs, dtype=np.int64)
        self.rhs = np.asarray(self.rhs, dtype=np.int64)
        n = len(self.rel)
        if len(self.lhs) != n or len(self.rhs) != n:
            raise ValueError(f"rel, lhs and rhs differ in length: {n}, {len(self.lhs)}, {len(self.rhs)}")
        if self.weight is not None:
            self.weight = np.asarray(self.weight, dtype=np.float32)
            if len(self.weight) != n:
                raise ValueError(f"weight has {len(self.weight)} entries for {n} edges")
        for side in SIDES:
            feats = self.features(side)
            if feats is not None and len(feats) != n:
                raise ValueError(f"{side} feature lists have {len(feats)} bags for {n} edges")

    def __len__(self) -> int:
        return len(self.rel)

    def features(self, side: Side) -> FeatureLists | None:
        return self.lhs_features if side == "lhs" else self.rhs_features

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EdgeBucket):
            return NotImplemented
        same_weight = (self.weight is None and other.weight is None) or (
            self.weight is not None and other.weight is not None
            and np.array_equal(self.weight, other.weight))
        return (np.array_equal(self.rel, other.rel) and np.array_equal(self.lhs, other.lhs)
                and np.array_equal(self.rhs, other.rhs) and same_weight
                and self.lhs_features == other.lhs_features
                and self.rhs_features == other.rhs_features)

    @classmethod
    def concat(cls, parts: list[EdgeBucket]) -> EdgeBucket:
        if not parts:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        nonempty = [p for p in parts if len(p)]
        if len(nonempty) == 1 and all(_same_layout(p, nonempty[0]) for p in parts):
            return nonempty[0]  # nothing to copy
        weights = [p.weight for p in parts]
        return cls(
            rel=np.concatenate([p.rel for p in parts]),
            lhs=np.concatenate([p.lhs for p in parts]),
            rhs=np.concatenate([p.rhs for p in parts]),
            weight=None if any(w is None for w in weights) else np.concatenate(weights),  # type: ignore[arg-type]
            lhs_features=_concat_features([p.lhs_features for p in parts]),
            rhs_features=_concat_features([p.rhs_features for p in parts]),
        )


def _same_layout(a: EdgeBucket, b: EdgeBucket) -> bool:
    return ((a.weight is None) == (b.weight is None) and (a.lhs_features is None) == (b.lhs_features is None)
            and (a.rhs_features is None) == (b.rhs_features is None))


def _concat_features(parts: list[FeatureLists | None]) -> FeatureLists | None:
    if all(p is None for p in parts):
        return None
    offsets = [np.zeros(1, np.int64)]
    datas = []
    base = 0
    for p in parts:
        if p is None:
            raise ValueError("cannot concatenate featurized and plain buckets")
        offsets.append(p.offsets[1:] - p.offsets[0] + base)
        datas.append(p.data)
        base += len(p.data)
    return FeatureLists(np.concatenate(offsets), np.concatenate(datas) if datas else np.zeros(0, np.int64))


# --------------------------------------------------------------------------- reading


def bucket_length(path: AnyPath) -> int:
    """Number of edges in a bucket file."""
    with open_h5(path) as f:
        check_format_version(f, path)
        raise_first([checks.dataset_missing(str(path), "rel") if "rel" not in f else None])
        return _length(f, path)


def read_bucket(path: AnyPath, *, chunk: tuple[int, int] | None = None,
                edge_range: tuple[int, int] | None = None) -> EdgeBucket:
    """Read a whole bucket, chunk ``(i, n)`` of it (as the original chunks it), or an edge range.

    Featurized offsets are rebased to start at 0 for the part read. The first problem the checks
    of :mod:`pbgio.checks.edges` find in what is read raises (the validator reports them all).
    """
    file = str(path)
    with open_h5(path) as f:
        check_format_version(f, path)
        raise_first(checks.missing_datasets(file, list(f)))
        n = _length(f, path)
        if chunk is not None:
            start, end = chunk_bounds(n, chunk[1], chunk[0])
        elif edge_range is not None:
            start = min(max(0, edge_range[0]), n)
            end = max(start, min(n, edge_range[1]))  # an empty or reversed range reads nothing
        else:
            start, end = 0, n
        arrays = {"rel": _read_int(f, path, "rel", start, end)}  # an unwritten rel is reported as such
        lengths = {name: _written(f, path, name).shape[0] for name in ("lhs", "rhs", "weight") if name in f}
        raise_first(checks.length_mismatch(file, name, length, n) for name, length in lengths.items())
        arrays.update((name, _read_int(f, path, name, start, end)) for name in ("lhs", "rhs"))
        weight = None
        if "weight" in f:
            weight = np.asarray(f["weight"][start:end], dtype=np.float32)
        feats: dict[str, FeatureLists | None] = {}
        for side in SIDES:
            if offsets_name(side) in f:
                raise_first([checks.offsets_pair(file, side, list(f)),
                             checks.offsets_length(file, side, _dataset(f, path, offsets_name(side)).shape[0], n)])
                off = _read_int(f, path, offsets_name(side), start, end + 1)
                order = checks.offsets_order(side, off)
                raise_first([order.first(file, start + 1) if order is not None else None])
                data_length = _dataset(f, path, data_name(side)).shape[0]
                raise_first([checks.offsets_end(file, side, int(off[0]), int(off[-1]), data_length, end,
                                                final=end == n)])
                data = _read_int(f, path, data_name(side), int(off[0]), int(off[-1]))
                feats[side] = FeatureLists(off - off[0], data)
            else:
                feats[side] = None
        return EdgeBucket(arrays["rel"], arrays["lhs"], arrays["rhs"], weight, feats["lhs"], feats["rhs"])


def _dataset(f: Any, path: AnyPath, name: str) -> Any:
    """Dataset ``name``, which must be a usable edge dataset (1-D, of its dtype; the first issue
    of :func:`pbgio.checks.edges.dataset_issues` raises)."""
    ds = f[name]
    shape, dtype = (tuple(ds.shape), ds.dtype) if isinstance(ds, h5py.Dataset) else (None, None)
    raise_first(i for i in checks.dataset_issues(str(path), name, shape, dtype, type(ds).__name__)
                if i.severity == "error")
    return ds


def _written(f: Any, path: AnyPath, name: str) -> Any:
    """Dataset ``name`` (as :func:`_dataset`), which stores every row it claims (as the validator
    finds unwritten data before it compares lengths)."""
    ds = _dataset(f, path, name)
    check_written(ds, path)
    return ds


def _length(f: Any, path: AnyPath) -> int:
    """The edge count: the length of the 1-D dataset ``rel``."""
    return int(_dataset(f, path, "rel").shape[0])


def _read_int(f: Any, path: AnyPath, name: str, start: int, end: int) -> Int64Array:
    """Rows ``[start, end)`` of int64 dataset ``name`` (a range the checks found within it)."""
    ds = _dataset(f, path, name)
    with BlockReader(ds, path) as reader:  # checks the file stores the rows before they are allocated
        out = np.empty(max(0, end - start), dtype=np.int64)
        reader.read(start, end, out)
    return out


# --------------------------------------------------------------------------- writing


class BucketWriter:
    """Stream edges into a bucket file; the file appears atomically on close.

    Datasets are chunked and resizable (``maxshape=(None,)``) like the original's
    importer writes them; featurized and weight datasets are declared by the first
    append (or up front) so that every edge gets offsets, unlike the original.
    """

    def __init__(self, path: AnyPath, *, buffer_edges: int = WRITE_CHUNK_ELEMENTS,
                 keep_open: bool = True) -> None:
        self.path = path
        self.buffer_edges = buffer_edges
        # With keep_open=False the file is closed after every flush and reopened for the next,
        # so that thousands of writers (one per bucket) do not hold thousands of open files.
        self.keep_open = keep_open
        self._started = False
        self._buffer: list[EdgeBucket] = []
        self._buffered = 0
        self._file: Any = None
        # A remote bucket is written to a local staging file and uploaded on close.
        self._stage = Path(tempfile.mkdtemp(prefix="pbg-stage-")) if storage.is_remote(path) else None
        self._tmp = (self._stage / path.name if self._stage is not None
                     else atomic.tmp_path_for(path))  # type: ignore[arg-type]
        self._layout: tuple[bool, bool, bool] | None = None
        self._data_len = {"lhs": 0, "rhs": 0}
        self.written = 0

    def __enter__(self) -> BucketWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def append(self, edges: EdgeBucket) -> None:
        layout = (edges.weight is not None, edges.lhs_features is not None, edges.rhs_features is not None)
        if self._layout is None:
            self._layout = layout
        elif layout != self._layout:
            raise ValueError(
                f"{self.path}: appended edges have weight/lhs features/rhs features {layout}, "
                f"earlier ones {self._layout}")
        self._buffer.append(edges)
        self._buffered += len(edges)
        if self._buffered >= self.buffer_edges:
            with atomic.write_failures(self.path):
                self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        block = EdgeBucket.concat(self._buffer)
        self._buffer, self._buffered = [], 0
        if self._file is None:
            if self._started:
                self._file = h5py.File(self._tmp, "r+")
            else:
                self._open(chunk=max(1, min(self.buffer_edges, len(block))))
        f: Any = self._file
        for name in INDEX_DATASETS:
            _append(f[name], getattr(block, name))
        if block.weight is not None:
            _append(f["weight"], block.weight)
        for side in SIDES:
            feats = block.features(side)
            if feats is not None:
                _append(f[offsets_name(side)], feats.offsets[1:] + self._data_len[side])
                _append(f[data_name(side)], feats.data)
                self._data_len[side] += len(feats.data)
        self.written += len(block)
        if not self.keep_open:
            f.close()
            self._file = None

    def _open(self, chunk: int) -> None:
        if self._stage is None:  # local: never into, or through, a link of the layout
            atomic.make_dirs(self.path.parent, "edge directory")
            confinement.check_write(str(self.path), "edge bucket")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic.create_new(self._tmp)
        self._file = h5py.File(self._tmp, "w")
        self._started = True
        f = self._file
        write_format_version(f)
        weight, lhs_feats, rhs_feats = self._layout or (False, False, False)
        for name in INDEX_DATASETS:
            f.create_dataset(name, shape=(0,), maxshape=(None,), chunks=(chunk,), dtype=np.int64)
        if weight:
            f.create_dataset("weight", shape=(0,), maxshape=(None,), chunks=(chunk,), dtype=np.float32)
        for side in SIDES:
            if lhs_feats if side == "lhs" else rhs_feats:
                f.create_dataset(offsets_name(side), data=np.zeros(1, np.int64), maxshape=(None,),
                                 chunks=(chunk,), dtype=np.int64)
                f.create_dataset(data_name(side), shape=(0,), maxshape=(None,), chunks=(chunk,),
                                 dtype=np.int64)

    def close(self) -> None:
        """Write what is buffered and move the file into place (empty buckets too); a failed
        write raises :class:`~pbgio.errors.OutputError` naming the bucket."""
        with atomic.write_failures(self.path):
            self._commit()

    def _commit(self) -> None:
        self._flush()
        if not self._started:
            self._open(chunk=1)
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._stage is not None:
            try:
                storage.upload(self._tmp, self.path)  # type: ignore[arg-type]
            finally:
                shutil.rmtree(self._stage, ignore_errors=True)
            return
        atomic.fsync_path(self._tmp)
        os.replace(self._tmp, self.path)  # type: ignore[arg-type]
        atomic.fsync_dir(self.path.parent)  # type: ignore[arg-type]

    def abort(self) -> None:
        """Drop everything; the target file is left as it was."""
        if self._file is not None:
            file, self._file = self._file, None
            with contextlib.suppress(Exception):  # a file whose flush failed fails to close again
                file.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink(missing_ok=True)
        if self._stage is not None:
            shutil.rmtree(self._stage, ignore_errors=True)


def _append(ds: Any, values: NDArray[Any]) -> None:
    if len(values) == 0:
        return
    old = ds.shape[0]
    ds.resize((old + len(values),))
    ds[old:] = values


def write_bucket(path: AnyPath, edges: EdgeBucket) -> None:
    """Write a whole bucket atomically (chunked, resizable datasets)."""
    with BucketWriter(path, buffer_edges=max(1, len(edges))) as writer:
        writer.append(edges)


def iter_buckets(edge_dir: AnyPath) -> Iterator[tuple[int, int, AnyPath]]:
    """``(lhs, rhs, path)`` of every bucket file in a directory, sorted."""
    from pbgio.spec.naming import parse_bucket_file

    found = []
    for p in edge_dir.iterdir():
        parsed = parse_bucket_file(p.name)
        if parsed:
            found.append((*parsed, p))
    yield from sorted(found)
