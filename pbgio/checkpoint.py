"""Versioned checkpoints: embeddings, model, config, stats, and the commit protocol.

Version N's files carry ``.vN``; ``checkpoint_version.txt`` names the newest
*committed* version and is written last, atomically and fsynced. A crash at any
point therefore leaves the previous version intact and loadable.

Why this module is long: it is the one reader and writer of every file of a version
(embeddings, model, version file, config copy, stats) and of the commit protocol that ties them
together; split by file, the commit would have to reach into each piece.

>>> import tempfile, pathlib, numpy as np
>>> ckpt = CheckpointDir(pathlib.Path(tempfile.mkdtemp()))
>>> ckpt.read_version()
0
>>> emb = np.ones((3, 2), dtype=np.float32)
>>> model = ModelState({"relations/0/operator/rhs/diagonal": np.ones(2, np.float32)})
>>> write_checkpoint(ckpt, 1, embeddings={("user", 0): EmbeddingsState(emb)}, model=model)
>>> ckpt.read_version(), ckpt.read_embeddings("user", 0).embeddings.shape
(1, (3, 2))
>>> sorted(p.name for p in ckpt.path.iterdir())
['checkpoint_version.txt', 'embeddings_user_0.v1.h5', 'model.v1.h5']
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from pbgio import confinement, storage
from pbgio.checks import checkpoint as checks
from pbgio.checks import entities as counts
from pbgio.checks import hdf5 as checks_hdf5
from pbgio.checks import optimizer as optimizer_checks
from pbgio.checks import raise_first
from pbgio.deprecation import renamed_names
from pbgio.errors import CheckpointInUseError, CorruptFileError, FormatError, Issue, MissingArtifactError
from pbgio.formats import files
from pbgio.formats.h5 import (
    InMemoryRows,
    attr_int,
    attr_str,
    check_format_version,
    check_written,
    link_name,
    mapped_rows,
    open_h5,
    read_row_chunks,
    read_whole,
    write_format_version,
)
from pbgio.formats.h5 import TableRows as TableRows  # re-exported: pbgtrain reads rows through it
from pbgio.spec import naming
from pbgio.spec.checkpoint import (
    CONFIG_JSON_ATTR,
    EMBEDDINGS_DATASET,
    ITERATION_ATTRS,
    MODEL_GROUP,
    OPTIMIZER_DATASET,
    STATE_DICT_KEY_ATTR,
    public_to_private,
)
from pbgio.spec.entities import format_count
from pbgio.storage import AnyPath, atomic

if TYPE_CHECKING:
    from pbgio.config import ConfigSchema

Float32Array = NDArray[np.float32]
T = TypeVar("T")
STATS_LIMIT = 256 << 20
"""Bytes of ``training_stats.json`` read whole (a line per bucket and iteration: a long run writes a few MB)."""
MAX_READ_ATTEMPTS = 100
"""Times :func:`read_committed` starts over on a newer version before it gives up."""


@dataclass(frozen=True)
class IterationInfo:
    """The iteration that was running when a file was written (index N writes vN+1)."""

    num_epochs: int
    epoch_idx: int
    num_edge_paths: int
    edge_path_idx: int
    edge_path: str
    num_edge_chunks: int
    edge_chunk_idx: int

    def to_attrs(self) -> dict[str, Any]:
        return {
            key: (getattr(self, key.split("/", 1)[1]) if kind is str
                  else np.int64(getattr(self, key.split("/", 1)[1])))
            for key, kind in ITERATION_ATTRS.items()
        }

    @classmethod
    def from_handle(cls, handle: Any) -> IterationInfo | None:
        values: dict[str, Any] = {}
        for key, kind in ITERATION_ATTRS.items():
            value = attr_str(handle, key) if kind is str else attr_int(handle, key)
            if value is None:
                return None
            values[key.split("/", 1)[1]] = value
        return cls(**values)


@dataclass(frozen=True)
class FileMetadata:
    """Root attributes of a checkpoint file besides ``format_version``."""

    config_json: str | None = None
    iteration: IterationInfo | None = None


@dataclass
class EmbeddingsState:
    embeddings: Float32Array
    optimizer_state: bytes | None = None

    def __post_init__(self) -> None:
        self.embeddings = np.asarray(self.embeddings, dtype=np.float32)
        if self.embeddings.ndim != 2:
            raise ValueError(f"embeddings are 2-D (count, dimension), got shape {self.embeddings.shape}")


@dataclass
class ModelState:
    """Model parameters by public name (``relations/0/operator/rhs/diagonal`` …)."""

    params: dict[str, Float32Array] = field(default_factory=dict)
    optimizer_state: bytes | None = None

    def __post_init__(self) -> None:
        for name in self.params:
            if public_to_private(name) is None:
                raise ValueError(f"model parameter name {name!r} maps to no state-dict key")
        self.params = {k: np.asarray(v, dtype=np.float32) for k, v in self.params.items()}

    def state_dict(self) -> dict[str, Float32Array]:
        """Parameters keyed by their private state-dict keys."""
        return {public_to_private(k) or k: v for k, v in self.params.items()}


@dataclass(frozen=True)
class CommitStep:
    """One durable step of writing a checkpoint version."""

    description: str
    run: Callable[[], None]


class CheckpointDir:
    """A checkpoint directory (``checkpoint_path``, or an ``init_path`` with v0 files)."""

    def __init__(self, path: str | AnyPath) -> None:
        self.path = storage.resolve(path)

    # ---- names
    def embeddings_path(self, entity_type: str, part: int, version: int) -> AnyPath:
        return self.path / naming.embeddings_file(entity_type, part, version)

    def model_path(self, version: int) -> AnyPath:
        return self.path / naming.model_file(version)

    @property
    def version_path(self) -> AnyPath:
        return self.path / naming.CHECKPOINT_VERSION

    # ---- version
    def read_version(self) -> int:
        """The committed version; a missing or empty version file means 0."""
        try:
            text = files.read_text(self.version_path, "checkpoint version file")
        except FileNotFoundError:
            return 0
        except (OSError, UnicodeDecodeError) as exc:
            raise FormatError(counts.text_unreadable("checkpoint version", str(self.version_path), exc)) from None
        if not text.strip():
            return 0
        version = counts.count_format("checkpoint version", str(self.version_path), text)
        if isinstance(version, Issue):
            raise FormatError(version)
        return version

    def _version_or_latest(self, version: int | None) -> int:
        return self.read_version() if version is None else version

    def versions_on_disk(self) -> list[int]:
        if not self.path.is_dir():
            return []
        found = set()
        for p in self.path.iterdir():
            parsed = naming.parse_versioned_file(p.name)
            if parsed:
                found.add(parsed[3])
        return sorted(found)

    def files_of_version(self, version: int) -> list[AnyPath]:
        if not self.path.is_dir():
            return []
        return sorted((p for p in self.path.iterdir()
                       if (parsed := naming.parse_versioned_file(p.name)) and parsed[3] == version),
                      key=lambda p: p.name)

    # ---- embeddings
    def write_embeddings(self, entity_type: str, part: int, version: int, state: EmbeddingsState,
                         metadata: FileMetadata | None = None) -> AnyPath:
        path = self.embeddings_path(entity_type, part, version)
        with _h5_writer(path, metadata) as f:
            f.create_dataset(EMBEDDINGS_DATASET, data=state.embeddings)
            _write_blob(f, state.optimizer_state)
        return path

    @contextlib.contextmanager
    def _table(self, entity_type: str, part: int, version: int) -> Iterator[tuple[Any, AnyPath]]:
        """The open file of a partition's table and its checked ``embeddings`` dataset."""
        path = self.embeddings_path(entity_type, part, version)
        with open_h5(path) as f:
            check_format_version(f, path)
            ds = f.get(EMBEDDINGS_DATASET)
            raise_first([checks.embeddings_dataset(str(path), *_member(ds))])
            yield ds, path

    def read_embeddings(self, entity_type: str, part: int, version: int | None = None) -> EmbeddingsState:
        with self._table(entity_type, part, self._version_or_latest(version)) as (ds, path):
            return EmbeddingsState(read_whole(ds, path), _read_blob(ds.file, path))

    def iter_embedding_rows(self, entity_type: str, part: int, version: int) -> Iterator[tuple[int, Float32Array]]:
        """``(first row, rows)`` of a partition's table in order, a bounded chunk at a time
        (:func:`pbgio.formats.h5.read_row_chunks`; ``PBG_ROW_CHUNK_BYTES``): what a stage that
        streams a table reads, in memory one chunk, whatever the partition's size."""
        with self._table(entity_type, part, version) as (ds, path):
            for start, rows in read_row_chunks(ds, path):
                yield start, np.ascontiguousarray(rows, dtype=np.float32)

    def map_embeddings(self, entity_type: str, part: int, version: int) -> TableRows:
        """A partition's table for reading rows here and there (evaluation, predictions): exactly the
        rows asked for, read from the file where HDF5 stores the table as plain bytes
        (:class:`pbgio.formats.h5.MappedRows`), else from the table held whole
        (:class:`~pbgio.formats.h5.InMemoryRows`)."""
        with self._table(entity_type, part, version) as (ds, path):
            mapped = mapped_rows(ds, path) if ds.dtype == np.float32 else None
            return mapped if mapped is not None else InMemoryRows(np.asarray(read_whole(ds, path), dtype=np.float32))

    def embeddings_shape(self, entity_type: str, part: int, version: int) -> tuple[int, ...]:
        """The shape of a partition's table, read without its values."""
        with self._table(entity_type, part, version) as (ds, _):
            return tuple(int(n) for n in ds.shape)

    def read_embedding_rows(self, entity_type: str, part: int, version: int,
                            offsets: NDArray[np.int64]) -> Float32Array:
        """Rows ``offsets`` (any order, repeats allowed) of a partition's table, read without the rest
        (a nearest-neighbour search re-ranks a few rows; a fingerprint checks a few)."""
        unique, inverse = np.unique(np.asarray(offsets, dtype=np.int64), return_inverse=True)
        with self._table(entity_type, part, version) as (ds, path):
            check_written(ds, path)
            if len(unique) and (unique[0] < 0 or unique[-1] >= ds.shape[0]):
                bad = int(unique[0] if unique[0] < 0 else unique[-1])
                raise ValueError(f"{path}: row {bad} asked for, outside its {ds.shape[0]} rows")
            rows = np.asarray(ds[unique] if len(unique) else np.zeros((0, ds.shape[1]), np.float32), np.float32)
        return np.ascontiguousarray(rows[inverse.reshape(-1)])

    # ---- model
    def write_model(self, version: int, model: ModelState, metadata: FileMetadata | None = None) -> AnyPath:
        path = self.model_path(version)
        with _h5_writer(path, metadata) as f:
            group = f.create_group(MODEL_GROUP, track_order=True)
            for name, value in model.params.items():
                ds = group.create_dataset(name, data=value)
                ds.attrs[STATE_DICT_KEY_ATTR] = public_to_private(name)
            _write_blob(f, model.optimizer_state)
        return path

    def read_model(self, version: int | None = None) -> ModelState:
        path = self.model_path(self._version_or_latest(version))
        with open_h5(path) as f:
            check_format_version(f, path)
            params: dict[str, Float32Array] = {}
            if MODEL_GROUP in f:
                for name, ds in _datasets(f[MODEL_GROUP]):
                    raise_first([checks.param_name(str(path), name, known=public_to_private(name) is not None),
                                 checks.param_dtype(str(path), name, ds.dtype)])
                    params[name] = read_whole(ds, path)
            return ModelState(params, _read_blob(f, path))

    def read_metadata(self, path: AnyPath) -> FileMetadata:
        with open_h5(path) as f:
            check_format_version(f, path)
            return FileMetadata(attr_str(f, CONFIG_JSON_ATTR), IterationInfo.from_handle(f))

    def foreign_entries(self) -> list[str]:
        """The names in this directory when it holds entries and none is a checkpoint's
        (:func:`pbgio.spec.naming.is_checkpoint_entry`): a directory of someone's other files, which a
        trainer must not write into (nor, later, delete from); empty for a checkpoint, an empty or
        missing directory, and remote storage."""
        if storage.is_remote(self.path) or not self.path.is_dir():
            return []
        names = sorted(p.name for p in self.path.iterdir())
        return [] if any(naming.is_checkpoint_entry(n) for n in names) else names

    # ---- the shared-storage probe of a distributed run
    def write_probe(self, token: str) -> None:
        """Leave ``token`` where every trainer of a distributed run must be able to read it."""
        atomic.make_dirs(self.path, "checkpoint directory")
        atomic.write_text(self.path / naming.SHARED_PROBE, token)

    def read_probe(self) -> str | None:
        """The probe's token, or None when this machine does not see it."""
        path = self.path / naming.SHARED_PROBE
        return files.read_text(path, "shared-storage probe") if path.is_file() else None

    def remove_probe(self) -> None:
        atomic.remove_file(self.path / naming.SHARED_PROBE, "shared-storage probe")

    # ---- config and stats
    def write_config(self, config: ConfigSchema | str) -> None:
        atomic.make_dirs(self.path, "checkpoint directory")
        text = config if isinstance(config, str) else config.to_json()
        atomic.write_text(self.path / naming.CONFIG_JSON, text)

    def read_config(self) -> ConfigSchema:
        from pbgio.config import load_config

        path = self.path / naming.CONFIG_JSON
        if not path.is_file():
            raise MissingArtifactError(str(path), "checkpoint config")
        return load_config(path)

    def append_stats(self, records: Iterable[Mapping[str, Any]]) -> None:
        atomic.make_dirs(self.path, "checkpoint directory")
        path = self.path / naming.TRAINING_STATS
        if storage.is_remote(path):  # object stores cannot append: rewrite the object whole
            old = storage.remote_call(path, "training stats", lambda: path.read_text(encoding="utf-8")
                                      if path.exists() else "")
            atomic.write_text(path, old + "".join(json.dumps(record) + "\n" for record in records))
            return
        fd = atomic.open_append(path, "training stats file")  # never through a link a layout shipped
        with os.fdopen(fd, "a", encoding="utf-8") as out:  # one write: readers see whole lines
            out.write("".join(json.dumps(record) + "\n" for record in records))
            out.flush()
            os.fsync(out.fileno())

    def read_stats(self) -> list[dict[str, Any]]:
        """Every line of ``training_stats.json``; the first line that breaks the format raises."""
        path = self.path / naming.TRAINING_STATS
        if not path.is_file():
            return []
        records = []
        data = files.read_bytes(path, "training stats file", limit=STATS_LIMIT)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = data[:exc.start].count(b"\n")
            raise FormatError(checks.stats_format(
                str(path), bad, f"expected UTF-8 text, found invalid bytes ({exc.reason})")) from None
        for index, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except (ValueError, RecursionError) as exc:  # invalid JSON, a too-long integer, too deep nesting
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else (
                    "nesting too deep to decode" if isinstance(exc, RecursionError) else str(exc)[:200])
                raise FormatError(checks.stats_format(
                    str(path), index, f"expected a JSON object, found invalid JSON ({reason})")) from None
            raise_first(checks.stats_line(str(path), index, value))
            records.append(value)
        return records

    # ---- snapshots
    def snapshot_versions(self) -> set[int]:
        """Versions that ``epoch_{k}/`` snapshots keep alive."""
        kept = set()
        if self.path.is_dir():
            for p in self.path.iterdir():
                if p.is_dir() and naming.SNAPSHOT_DIR_RE.match(p.name):
                    version = CheckpointDir(p).read_version()
                    if version:
                        kept.add(version)
        return kept


def _datasets(group: Any, prefix: str = "", enclosing: frozenset[int] = frozenset()) -> Iterable[tuple[str, Any]]:
    import h5py

    file = str(group.file.filename)
    raise_first([checks.param_member(file, link_name(group.name).lstrip("/"), type(group).__name__, group=True)])
    enclosing = enclosing | {hash(group.id)}  # HDF5 objects hash by file and address
    for raw, item in group.items():
        key = link_name(raw)
        name = f"{prefix}{key}"
        if isinstance(item, h5py.Dataset):
            yield name, item
        elif isinstance(item, h5py.Group):
            if hash(item.id) in enclosing:  # a hard link back up the tree (found by the guided fuzzer)
                raise CorruptFileError(checks_hdf5.unreadable(
                    file, f"{link_name(group.name).lstrip('/')}/{key}",
                    "expected a tree of parameter groups, found a link to a group that encloses it (a cycle)"))
            yield from _datasets(item, f"{name}/", enclosing)
        else:  # a named datatype: no parameter
            raise_first([checks.param_member(file, f"{link_name(group.name).lstrip('/')}/{key}", type(item).__name__,
                                             group=False)])


def _member(item: Any) -> tuple[str | None, int | None, Any]:
    """What a member of an HDF5 file is, as checks take it: its kind (a type name; None when
    absent) and, for a dataset, its number of dimensions and dtype."""
    if item is None:
        return None, None, None
    return type(item).__name__, getattr(item, "ndim", None), getattr(item, "dtype", None)


@contextlib.contextmanager
def _h5_writer(path: AnyPath, metadata: FileMetadata | None) -> Iterator[Any]:
    """Write an HDF5 checkpoint file atomically, stamping the root attributes. A failure of the
    disk (while writing, flushing or closing) is an OutputError and leaves no file behind."""
    import h5py

    metadata = metadata or FileMetadata()
    atomic.make_dirs(path.parent, "checkpoint directory")
    with atomic.atomic_target(path) as tmp, h5py.File(tmp, "w") as f:
        write_format_version(f)
        if metadata.config_json is not None:
            f.attrs[CONFIG_JSON_ATTR] = metadata.config_json
        if metadata.iteration is not None:
            for key, value in metadata.iteration.to_attrs().items():
                f.attrs[key] = value
        yield f


def _write_blob(f: Any, blob: bytes | None) -> None:
    if blob is not None:
        f.create_dataset(OPTIMIZER_DATASET, data=np.frombuffer(blob, dtype=np.dtype("V1")))


def _read_blob(f: Any, path: AnyPath) -> bytes | None:
    if OPTIMIZER_DATASET not in f:
        return None
    ds = f[OPTIMIZER_DATASET]
    raise_first([optimizer_checks.blob_dataset(str(path), *_member(ds))])
    return bytes(read_whole(ds, path).tobytes())


# --------------------------------------------------------------------------- readers beside a writer


def read_committed(ckpt: CheckpointDir, read: Callable[[int], T], version: int | None = None) -> T:
    """``read(v)`` for the committed version ``v``, all of whose files it reads (never a mix).

    A writer committing meanwhile removes the files of ``v`` once ``v + 1`` is committed; a read
    that then misses one (or finds it gone mid-read) starts over on the new committed version, at
    most :data:`MAX_READ_ATTEMPTS` times. A failure while the committed version stayed ``v`` is
    the data's, and raised. With ``version`` given, ``read(version)`` runs once.

    >>> import tempfile, pathlib
    >>> ckpt = CheckpointDir(pathlib.Path(tempfile.mkdtemp()))
    >>> model = ModelState({"relations/0/operator/rhs/diagonal": np.ones(2, np.float32)})
    >>> write_checkpoint(ckpt, 1, embeddings={}, model=model)
    >>> calls = []
    >>> def read(v):  # the first attempt loses its file to a commit of version 2
    ...     calls.append(v)
    ...     if len(calls) == 1:
    ...         write_checkpoint(ckpt, 2, embeddings={}, model=model)
    ...     return ckpt.read_model(v).params["relations/0/operator/rhs/diagonal"].shape
    >>> read_committed(ckpt, read), calls
    ((2,), [1, 2])
    """
    if version is not None:
        return read(version)
    attempts = 0
    while True:
        current = ckpt.read_version()
        try:
            return read(current)
        except (FileNotFoundError, CorruptFileError, storage.StorageError):
            attempts += 1
            if attempts >= MAX_READ_ATTEMPTS or ckpt.read_version() == current:
                raise


# --------------------------------------------------------------------------- commit protocol


def commit_steps(
    ckpt: CheckpointDir,
    version: int,
    *,
    embeddings: Mapping[tuple[str, int], EmbeddingsState],
    model: ModelState | None,
    metadata: FileMetadata | None = None,
    config: ConfigSchema | str | None = None,
    snapshot_epoch: int | None = None,
) -> list[CommitStep]:
    """The steps that write and commit ``version``, in order.

    Files of the new version first (each atomic), then ``config.json``, then the
    version file (the commit point), then an optional ``epoch_{k}/`` snapshot,
    then removal of the previous version's files unless it is v0 or a snapshot keeps it.
    """
    if version <= 0:
        raise ValueError(f"checkpoint versions start at 1, got {version}")
    steps: list[CommitStep] = []
    for (etype, part), state in embeddings.items():
        steps.append(CommitStep(f"write {naming.embeddings_file(etype, part, version)}",
                                functools.partial(_write_embeddings, ckpt, etype, part, version, state,
                                                  metadata)))
    if model is not None:
        steps.append(CommitStep(f"write {naming.model_file(version)}",
                                lambda: _discard(ckpt.write_model(version, model, metadata))))
    if config is not None:
        steps.append(CommitStep(f"write {naming.CONFIG_JSON}", lambda: ckpt.write_config(config)))
    steps.append(CommitStep(f"commit {naming.CHECKPOINT_VERSION} = {version}",
                            lambda: atomic.write_text(ckpt.version_path, format_count(version))))
    if snapshot_epoch is not None:
        steps.append(CommitStep(f"snapshot {naming.snapshot_dir(snapshot_epoch)}",
                                lambda: _snapshot(ckpt, version, snapshot_epoch)))
    steps.append(CommitStep(f"remove versions older than {version}",
                            lambda: remove_superseded(ckpt, version)))
    return steps


__getattr__ = renamed_names(__name__, {"plan_checkpoint": "commit_steps"})
"""``plan_checkpoint``: :func:`commit_steps` before it was renamed (it lists a commit's steps; "plan"
named other things), kept for one release."""


def _discard(_: object) -> None:
    return None


def _write_embeddings(ckpt: CheckpointDir, etype: str, part: int, version: int, state: EmbeddingsState,
                      metadata: FileMetadata | None) -> None:
    ckpt.write_embeddings(etype, part, version, state, metadata)


def write_checkpoint(ckpt: CheckpointDir, version: int, **kwargs: Any) -> None:
    """Write and commit a checkpoint version (see :func:`commit_steps`)."""
    for step in commit_steps(ckpt, version, **kwargs):
        step.run()


def remove_superseded(ckpt: CheckpointDir, committed: int) -> None:
    """Delete files of versions below ``committed``, except v0 and snapshot-kept ones."""
    found = ckpt.read_version()
    if found != committed:  # the directory changed since ``committed`` was read: delete nothing
        if not ckpt.version_path.exists():
            raise MissingArtifactError(str(ckpt.version_path), "checkpoint version file (removed while the run "
                                       f"started from version {committed})")
        raise CheckpointInUseError(str(ckpt.path), "another process",
                                   f"its version file says {found} where this run read {committed}")
    keep = ckpt.snapshot_versions() | {0, committed}
    for version in ckpt.versions_on_disk():
        if version < committed and version not in keep:
            for path in ckpt.files_of_version(version):
                atomic.remove_file(path, "superseded checkpoint file")


def remove_uncommitted(ckpt: CheckpointDir) -> list[AnyPath]:
    """Delete files of versions above the committed one (left by an interrupted run); return them.

    They are never loaded (a resumed run starts from the committed version and writes them
    again), so removing them only keeps the directory tidy and the validator quiet.
    """
    committed = ckpt.read_version()
    removed = []
    for version in ckpt.versions_on_disk():
        if version > committed:
            for path in ckpt.files_of_version(version):
                atomic.remove_file(path, "uncommitted checkpoint file")
                removed.append(path)
    return removed


def _snapshot(ckpt: CheckpointDir, version: int, epoch: int) -> None:
    """``epoch_{k}/``: absolute links to version's files and a real version file."""
    snap = ckpt.path / naming.snapshot_dir(epoch)
    atomic.real_dir(snap, "snapshot directory")  # never a link a layout shipped: it would receive the files
    for path in ckpt.files_of_version(version):
        link = snap / path.name
        if storage.is_remote(path) and storage.is_remote(link):  # no links on object stores: a copy
            storage.remote_call(link, "snapshot", functools.partial(path.fs.copy, path.path, link.path))
        elif not storage.is_remote(path) and not link.is_symlink():
            confinement.check_write(str(link), "snapshot link")
            link.symlink_to(path.resolve())
    atomic.write_text(snap / naming.CHECKPOINT_VERSION, format_count(version))
