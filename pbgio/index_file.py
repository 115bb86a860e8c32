"""The index artifact of a checkpoint (:mod:`pbgio.spec.index`): its file, read and written
atomically with every rule of :mod:`pbgio.checks.index` enforced, and the rows it indexes.

The file is written through a temp file renamed into place, so a build killed at any point
leaves the previous index or none, never half of one. The payload is streamed into it, never
whole in memory, and stored as one run of plain bytes, which a search maps instead of loading
(:func:`load_index_payload`). :class:`TypeRows` gives one entity type's rows of one version as
export writes them (global embedding added when asked), a bounded chunk at a time or a few
rows here and there, and their fingerprint.

>>> import tempfile, pathlib
>>> from pbgio.testing import small_valid_layout, write_layout
>>> from pbgio.config import load_config
>>> config = write_layout(pathlib.Path(tempfile.mkdtemp()), small_valid_layout(featurized=False))
>>> cfg = load_config(config)
>>> rows = TypeRows(cfg, CheckpointDir(config.parent / "checkpoint"), 1, "user", add_global=True)
>>> rows.partition_rows(), rows.dimension, len(rows.fingerprint())
([5, 4], 4, 64)
>>> [(first, len(chunk)) for first, chunk in rows.chunks(1)]
[(0, 4)]
>>> bool((rows.rows(1, [3, 0])[0] == rows.partition(1)[3]).all())
True
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from pbgio.checkpoint import CheckpointDir
from pbgio.checks import index as checks
from pbgio.checks import raise_first
from pbgio.checks.checkpoint import param_missing
from pbgio.config import ConfigSchema
from pbgio.errors import FormatError, Issue, PbgioError
from pbgio.formats import faiss_claims
from pbgio.formats.h5 import (
    attr_str,
    check_format_version,
    check_written,
    mapped_rows,
    open_h5,
    write_format_version,
)
from pbgio.spec.checkpoint import global_embedding_name
from pbgio.spec.index import META_ATTR, PAYLOAD_DATASET, fingerprint_offsets
from pbgio.storage import AnyPath, atomic

SEARCH_PARAMS = ("nprobe", "ef_search")
"""The parameters of an index (:attr:`IndexMeta.params`) that a search may change."""

HASH_BLOCK = 1 << 24
T = TypeVar("T")
Floats = NDArray[np.float32]
Payload = NDArray[np.uint8]
PayloadSink = Callable[[bytes], object]
"""Takes a serialized index's next bytes, in order (the library's writer calls it piece by piece)."""
PayloadWriter = Callable[[PayloadSink], None]
"""Serializes an index into the sink it is given: the same bytes, in the same order, at every call."""


@dataclass(frozen=True)
class IndexMeta:
    """The metadata of an index file (the keys of :data:`pbgio.spec.index.META_FIELDS`)."""

    entity_type: str
    version: int
    metric: str
    add_global: bool
    dimension: int
    partition_rows: list[int]
    fingerprint: str
    library: str
    library_version: str
    kind: str
    params: dict[str, int] = field(default_factory=dict)
    payload_sha256: str = ""
    recall_at_10: float | None = None
    recall_queries: int = 0
    recall_candidates: int = 0

    @property
    def rows(self) -> int:
        return sum(self.partition_rows)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def searched(self, params: dict[str, int] | None = None) -> str:
        """Library, kind and parameters (``params``: those a search uses, default the stored ones)."""
        shown = ", ".join(f"{k} {v}" for k, v in sorted((self.params if params is None else params).items()))
        return f"{self.library} {self.kind}{f' ({shown})' if shown else ''}"

    def accuracy(self, params: dict[str, int] | None = None, candidates: int | None = None) -> str:
        """What a search through this index gives: ``exact`` (a flat index), or ``approximate`` with
        the recall@10 measured at build, and the settings it was measured at when a search's
        (``params``: nprobe or ef_search; ``candidates``: rows proposed) differ from them.

        >>> meta = IndexMeta("user", 1, "cos", False, 4, [9], "", "faiss", "1.8", "ivf", {"nlist": 3, "nprobe": 2})
        >>> meta.accuracy()
        'approximate (recall not measured at build)'
        >>> from dataclasses import replace
        >>> meta = replace(meta, recall_at_10=0.9625, recall_queries=500, recall_candidates=100)
        >>> meta.accuracy()
        'approximate (recall@10 ≈ 0.963 measured at build)'
        >>> print(meta.accuracy({"nlist": 3, "nprobe": 1}, candidates=20))  # doctest: +NORMALIZE_WHITESPACE
        approximate (recall@10 ≈ 0.963 measured at build with nprobe 2 and 100 candidates; not at nprobe 1 and 20
        candidates)
        """
        if self.kind == "flat":
            return "exact"
        if self.recall_at_10 is None or not self.recall_queries:
            return "approximate (recall not measured at build)"
        measured = f"recall@10 ≈ {self.recall_at_10:.3f} measured at build"
        searched = {**self.params, **(params or {})}
        changed = sorted(key for key in SEARCH_PARAMS if key in self.params and searched[key] != self.params[key])
        other_count = candidates is not None and candidates != self.recall_candidates
        if not changed and not other_count:
            return f"approximate ({measured})"
        at = [f"{key} {self.params[key]}" for key in SEARCH_PARAMS if key in self.params]
        now = [f"{key} {searched[key]}" for key in changed]
        return (f"approximate ({measured} with {' and '.join([*at, f'{self.recall_candidates:,} candidates'])}; "
                f"not at {' and '.join([*now, *([f'{candidates:,} candidates'] if other_count else [])])})")

    def describe(self) -> str:
        """One line: kind, parameters, rows, metric, version."""
        return (f"{self.searched()} index of {self.rows:,} {self.entity_type!r} rows by {self.metric}, checkpoint "
                f"version {self.version}")


def stale_issue(config: ConfigSchema, checkpoint: CheckpointDir, version: int, meta: IndexMeta,
                file: str) -> Issue | None:
    """``index-stale`` unless ``meta`` matches the tables of ``version`` (rows per partition,
    dimension, fingerprint); reading those tables may raise their own format errors."""
    rows = TypeRows(config, checkpoint, version, meta.entity_type, add_global=meta.add_global)
    counts = rows.partition_rows()
    fingerprint = rows.fingerprint() if counts == meta.partition_rows else None
    return checks.stale(file, asdict(meta), counts, rows.dimension, fingerprint)


def dataset_digest(ds: Any) -> str:
    """SHA-256 of a stored payload dataset, read a block at a time (never whole in memory)."""
    digest = hashlib.sha256()
    for start in range(0, ds.shape[0], HASH_BLOCK):
        digest.update(np.asarray(ds[start:start + HASH_BLOCK], dtype=np.uint8).tobytes())
    return digest.hexdigest()


class PayloadSizeError(PbgioError, RuntimeError):
    """The library serialized an index to a different number of bytes the second time (nothing was
    written under the index's name)."""


def write_index_file(path: AnyPath, meta: IndexMeta, write: PayloadWriter) -> tuple[IndexMeta, int]:
    """Write ``path`` atomically: the payload ``write`` serializes and the metadata, stamped with
    the payload's digest; returns that metadata and the payload's size.

    ``write`` runs twice, the payload never whole in memory: once to count its bytes, then into a
    contiguous dataset of that size (one run of plain bytes in the file, which a search maps:
    :func:`load_index_payload`), :data:`HASH_BLOCK` bytes at a time, hashed on the way."""
    import h5py

    size = _payload_size(write)
    atomic.make_dirs(path.parent, "index directory")
    with atomic.atomic_target(path) as tmp, h5py.File(tmp, "w") as f:
        write_format_version(f)
        sink = _DatasetSink(f.create_dataset(PAYLOAD_DATASET, shape=(size,), dtype=np.uint8), path)
        write(sink)
        stamped = IndexMeta(**{**asdict(meta), "payload_sha256": sink.finish()})
        f.attrs[META_ATTR] = stamped.to_json()
    return stamped, size


def _payload_size(write: PayloadWriter) -> int:
    """Bytes ``write`` serializes (counted, not kept)."""
    size = 0

    def count(piece: bytes) -> None:
        nonlocal size
        size += len(piece)

    write(count)
    return size


class _DatasetSink:
    """Writes the pieces it is given, in order, into a 1-D uint8 dataset of their total size,
    :data:`HASH_BLOCK` bytes at a time, hashing them on the way."""

    def __init__(self, ds: Any, path: AnyPath) -> None:
        self.ds = ds
        self.path = path
        self.digest = hashlib.sha256()
        self.written = 0
        self.pending = bytearray()

    def __call__(self, piece: bytes) -> None:
        self.digest.update(piece)
        self.pending += piece
        if len(self.pending) >= HASH_BLOCK:
            self._flush()

    def _flush(self) -> None:
        stop = self.written + len(self.pending)
        if stop > self.ds.shape[0]:
            raise self._changed(f"at least {stop:,}")
        self.ds[self.written:stop] = np.frombuffer(self.pending, np.uint8)
        self.written, self.pending = stop, bytearray()

    def finish(self) -> str:
        """The payload's digest, once every piece is written (all the bytes counted)."""
        self._flush()
        if self.written != self.ds.shape[0]:
            raise self._changed(f"{self.written:,}")
        return self.digest.hexdigest()

    def _changed(self, size: str) -> PayloadSizeError:
        return PayloadSizeError(f"{self.path}: the index serialized to {self.ds.shape[0]:,} bytes, then to {size}; "
                                "nothing was written")


def meta_problem(file: str, f: Any) -> tuple[IndexMeta | None, Issue | None]:
    """The metadata of an open index file, or the ``index-foreign`` issue with it."""
    ds = f.get(PAYLOAD_DATASET)
    kind = None if ds is None else type(ds).__name__
    ndim = getattr(ds, "ndim", None)
    dtype = getattr(ds, "dtype", None)
    issue = checks.payload_dataset(file, kind, ndim, dtype)
    if issue is not None:
        return None, issue
    value, issue = checks.metadata(file, attr_str(f, META_ATTR))
    if value is None:
        return None, issue
    return IndexMeta(**{key: value[key] for key in IndexMeta.__dataclass_fields__}), None


def read_index_meta(path: AnyPath) -> IndexMeta:
    """The metadata of ``path`` (FormatError ``index-foreign`` when it is not an index file)."""
    with open_h5(path) as f:
        check_format_version(f, path)
        meta, issue = meta_problem(str(path), f)
    raise_first([issue])
    assert meta is not None
    return meta


def payload_claims_issue(file: str | None, meta: IndexMeta, ds: Any) -> Issue | None:
    """``index-damaged`` unless the payload (``ds``, a 1-D uint8 dataset or array) is an index of a
    type pbg builds whose header and size fields claim no more than its bytes hold, and agree with
    ``meta`` (kind, rows, dimension, nlist): :mod:`pbgio.formats.faiss_claims`, which reads those
    fields only (a few reads), never the whole payload. The library allocates what a header
    claims before it reads the bytes: a payload must pass this before the library sees it."""
    def read(start: int, count: int) -> bytes:
        return np.asarray(ds[start:start + count], dtype=np.uint8).tobytes()

    try:
        claims = faiss_claims.payload_claims(read, int(ds.shape[0]))
    except faiss_claims.ClaimError as exc:
        return checks.unloadable(file, f"{exc}; refused before {meta.library} reads it")
    problem = faiss_claims.disagreement(claims, kind=meta.kind, rows=meta.rows, dimension=meta.dimension,
                                        nlist=meta.params.get("nlist"))
    return None if problem is None else checks.unloadable(file, problem)


def load_index_payload(path: AnyPath, meta: IndexMeta, view: Callable[[Payload], T],
                       stream: Callable[[Callable[[int], bytes]], T]) -> T:
    """The index of ``path``'s payload, once the payload matches the recorded digest and its
    header claims no more than it holds and agrees with ``meta`` (``index-damaged``; hashed a
    block at a time; the header read a field at a time: :func:`payload_claims_issue`).

    Where the payload is one run of plain bytes in a local file (as :func:`write_index_file`
    writes it; :func:`pbgio.formats.h5.mapped_rows`), ``view(payload)`` gets it as a read-only
    memory map (which lives as long as ``payload``): an index that keeps its large arrays in place
    reads the pages a search touches, so memory never holds the payload. Elsewhere (remote
    storage, a payload stored in chunks), ``stream(read)``, where ``read(n)`` gives the payload's
    next ``n`` bytes (fewer at its end): memory holds the loaded index, not also its bytes."""
    with open_h5(path) as f:
        ds = f[PAYLOAD_DATASET]
        check_written(ds, path)
        issue = checks.damaged(str(path), asdict(meta), dataset_digest(ds), ds.shape[0])
        if issue is None:
            issue = payload_claims_issue(str(path), meta, ds)
        if issue is not None:
            raise FormatError(issue)
        mapped = mapped_rows(ds, path)
        if mapped is not None:
            return view(mapped.array)
        return stream(byte_reader(ds))


def byte_reader(payload: Any) -> Callable[[int], bytes]:
    """``read(n)``: the next ``n`` bytes of ``payload`` (a 1-D uint8 dataset or array; fewer at its
    end), read a slice at a time."""
    position = 0

    def read(count: int) -> bytes:
        nonlocal position
        stop = min(payload.shape[0], position + count)
        chunk = np.asarray(payload[position:stop], dtype=np.uint8).tobytes()
        position = stop
        return chunk

    return read


class TypeRows:
    """One entity type's rows of one version, as indexed: a bounded chunk at a time, or a few here
    and there (a whole partition only for tools and tests that compare against one)."""

    def __init__(self, config: ConfigSchema, checkpoint: CheckpointDir, version: int, entity_type: str, *,
                 add_global: bool) -> None:
        self.checkpoint = checkpoint
        self.version = version
        self.entity_type = entity_type
        self.add_global = add_global and config.global_emb
        self.shift = self._global_embedding() if self.add_global else None
        self.num_partitions = config.num_partitions(entity_type)
        self.dimension = config.entity_dimension(entity_type)
        self._rows: list[int] | None = None

    def _global_embedding(self) -> Floats:
        name = global_embedding_name(self.entity_type)
        value = self.checkpoint.read_model(self.version).params.get(name)
        if value is None:
            raise_first(param_missing(str(self.checkpoint.model_path(self.version)), [name]))
        return np.asarray(value, dtype=np.float32)

    def partition_rows(self) -> list[int]:
        """Rows of each partition's table (read from the files' shapes)."""
        if self._rows is None:
            ckpt, version = self.checkpoint, self.version
            self._rows = [ckpt.embeddings_shape(self.entity_type, p, version)[0] for p in range(self.num_partitions)]
        return list(self._rows)

    def partition(self, part: int) -> Floats:
        """All rows of partition ``part``, in memory at once (tools and tests; a build reads :meth:`chunks`)."""
        return self._shifted(self.checkpoint.read_embeddings(self.entity_type, part, self.version).embeddings)

    def chunks(self, part: int) -> Iterator[tuple[int, Floats]]:
        """``(first row, rows)`` of partition ``part`` in order, a bounded chunk at a time
        (:meth:`pbgio.checkpoint.CheckpointDir.iter_embedding_rows`), the global embedding added to each."""
        for first, values in self.checkpoint.iter_embedding_rows(self.entity_type, part, self.version):
            yield first, self._shifted(values)

    def rows(self, part: int, offsets: Sequence[int] | NDArray[np.int64]) -> Floats:
        """Rows ``offsets`` of partition ``part``, in the order given."""
        return self._shifted(self.checkpoint.read_embedding_rows(self.entity_type, part, self.version,
                                                                 np.asarray(offsets, dtype=np.int64)))

    def _shifted(self, values: Floats) -> Floats:
        """As export writes rows: float32, plus the global embedding (float32 + float32)."""
        return np.ascontiguousarray(values if self.shift is None else values + self.shift, dtype=np.float32)

    def fingerprint(self) -> str:
        """The fingerprint of :mod:`pbgio.spec.index`: each partition's rows at
        :func:`~pbgio.spec.index.fingerprint_offsets`, read alone."""
        counts = self.partition_rows()
        return fingerprint(counts, [self.rows(p, fingerprint_offsets(n)) for p, n in enumerate(counts)])


def fingerprint(partition_rows: Sequence[int], sampled: Sequence[Floats]) -> str:
    """SHA-256 (hex) of the row counts and each partition's sampled rows (float32 bytes)."""
    digest = hashlib.sha256(np.asarray(partition_rows, dtype="<i8").tobytes())
    for rows in sampled:
        digest.update(np.ascontiguousarray(rows, dtype="<f4").tobytes())
    return digest.hexdigest()
