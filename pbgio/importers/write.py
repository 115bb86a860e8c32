"""Writing a layout: staged beside its final place, moved in only when complete.

Every output directory (``entity_path`` and each edge path) gets a hidden staging
directory inside it, and the import writes only there. :meth:`Staging.commit` then
moves the files into place: buckets first, then names and relation files, and the
entity count files last. A layout interrupted at any point therefore lacks count
files, and ``pbgio validate`` rejects it; a failed import removes its staging
directories and leaves any earlier layout as it was.

A killed import (``kill -9``, a power cut) cannot clean up: it leaves its staging
directories behind, and, when killed while moving files into place, part of a layout.
The commit marks itself in progress first (:data:`COMMIT_MARKER` in the first staging
directory, removed once every file is in place), so the next import into the same
directories (:func:`remove_stale_staging`) knows the layout files beside a dead import's
marker are an unfinished commit: it removes them and the dead import's staging
directories, and imports as if they had never been there.

An append (``append=True``, :mod:`~pbgio.importers.append`) replaces a layout that must
survive a failure. Before its commit it hard-links every layout file of each output
directory into :data:`BACKUP_DIR` inside that directory's staging directory (a copy where
the file system has no hard links), then moves files in as above, the entity counts it
replaces removed first. An exception or Ctrl-C during the commit, or the next import
finding a dead append's marker, *rolls back*: the half-moved layout files are removed and
the backed-up ones linked back, leaving the old layout byte for byte. The backups stay until
the staging directories go, so a rollback that is itself killed is done again by the next import;
a dead append that had moved every file in (and begun no rollback) is complete and is kept.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> with Staging([root / "entities"], overwrite=False) as stage:
...     _ = (stage.staged(root / "entities") / "entity_count_user_0.txt").write_text("3\\n")
...     stage.commit()
>>> sorted(p.name for p in (root / "entities").iterdir())
['entity_count_user_0.txt']
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

import numpy as np
from numpy.typing import NDArray

from pbgio import confinement, storage
from pbgio.edges import BucketWriter, EdgeBucket, FeatureLists, bucket_length, read_bucket
from pbgio.errors import OutputError, PbgioError
from pbgio.importers.mapping import EdgeBatch
from pbgio.spec import naming
from pbgio.spec.edges import WRITE_CHUNK_ELEMENTS
from pbgio.storage import AnyPath
from pbgio.storage.atomic import fsync_dir, fsync_path, tmp_path_for, write_failures
from pbgio.storage.lock import process_alive

# Edges buffered over all the buckets of an edge path before they are written (24 bytes each,
# more with weights and features); with many buckets each one gets a share, but never fewer
# than MIN_BUFFER_EDGES.
BUFFER_BUDGET_EDGES = 2 * WRITE_CHUNK_ELEMENTS
MIN_BUFFER_EDGES = 1 << 14
# Above this many buckets, bucket files are closed between writes (open-file limits).
MAX_OPEN_BUCKETS = 256
STAGING_PREFIX = ".pbgio-import-"
_STAGING_RE = re.compile(rf"^{re.escape(STAGING_PREFIX)}(?P<pid>\d+)-[0-9a-f]+$")
COMMIT_MARKER = "COMMITTING"
"""In the first staging directory while :meth:`Staging.commit` moves files into place."""
BACKUP_DIR = "previous"
"""In each staging directory of an append: hard links to the layout files it replaces."""
ROLLBACK_MARKER = "ROLLING_BACK"
"""In the first staging directory of an append once it starts putting the old layout back."""


class LayoutExistsError(PbgioError, FileExistsError):
    """An output directory already holds layout files and overwriting was not asked for."""


def _rank(name: str) -> int | None:
    """Commit order of a layout file: buckets, then names and relation files, counts last."""
    if naming.parse_bucket_file(name):
        return 0
    if naming.parse_entity_names_file(name) or name in (naming.DYNAMIC_REL_NAMES, naming.DYNAMIC_REL_COUNT):
        return 1
    if naming.parse_entity_count_file(name):
        return 2
    return None


def layout_files(directory: Path) -> list[Path]:
    """Files of a layout in ``directory`` (entity files, relation files, buckets)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_file() and _rank(p.name) is not None)


class RemoteTargets:
    """Local stand-ins for remote output directories: the import writes (and commits) them
    locally, then :meth:`publish` uploads them, counts last, so that a reader of the remote
    layout never sees entity counts before the files they describe."""

    def __init__(self, targets: Iterable[AnyPath], *, overwrite: bool) -> None:
        self.overwrite = overwrite
        self.local: dict[str, tuple[AnyPath, Path]] = {}
        for target in targets:
            if storage.is_remote(target) and str(target) not in self.local:
                stand_in = Path(tempfile.mkdtemp(prefix="pbg-import-")) / "out"
                confinement.admit(stand_in.parent, write=True)  # the command's own stand-in, uploaded at the end
                self.local[str(target)] = (target, stand_in)

    def stand_in(self, target: AnyPath) -> Path:
        """The local directory written in place of ``target`` (``target`` itself when local)."""
        return self.local[str(target)][1] if storage.is_remote(target) else target

    def check(self) -> None:
        """Refuse remote directories that hold a layout already, unless overwriting."""
        for target, _ in self.local.values():
            existing = remote_layout_files(target)
            if existing and not self.overwrite:
                raise LayoutExistsError(
                    f"{storage.display(existing[0])}: the output directory {storage.display(target)} already "
                    f"holds layout files ({len(existing)}); pass --overwrite (overwrite=True) to replace them")

    def publish(self) -> None:
        """Upload every stand-in (buckets, then names, then counts); drop old layout files first."""
        for target, _ in self.local.values():
            for path in sorted(remote_layout_files(target), key=lambda p: -(_rank(p.name) or 0)):
                with storage.remote_errors(path, "remove"):
                    path.unlink()
        for rank in (0, 1, 2):
            for target, local in self.local.values():
                for path in sorted(local.iterdir()):
                    if _rank(path.name) == rank:
                        storage.upload(path, target / path.name)  # type: ignore[arg-type]

    def close(self) -> None:
        for _, local in self.local.values():
            shutil.rmtree(local.parent, ignore_errors=True)


def remote_layout_files(directory: AnyPath) -> list[AnyPath]:
    """Layout files (entity files, relation files, buckets) in a remote directory."""
    with storage.remote_errors(directory, "list"):
        if not directory.is_dir():
            return []
    return [p for p in storage.children(directory) if _rank(p.name) is not None]


class Staging:
    """Hidden staging directories for a set of output directories, committed together.

    ``append``: the directories hold a layout that the staged files extend (files of the same
    names replace theirs); it is backed up before the commit and restored if the commit fails.
    """

    def __init__(self, targets: Iterable[Path], *, overwrite: bool, append: bool = False) -> None:
        self.targets = list(dict.fromkeys(Path(os.path.abspath(t)) for t in targets))
        self.overwrite = overwrite
        self.append = append
        self.token = f"{STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self._created: list[Path] = []
        self._committing = False
        self._committed = False

    def check(self) -> None:
        """Clean up after killed imports into the same directories (:func:`remove_stale_staging`),
        then refuse directories that hold a layout already, unless overwriting. In a command, each
        directory must be one it may write, reached without a link of the layout
        (:func:`pbgio.confinement.check_write`)."""
        for target in self.targets:
            confinement.check_write(target, "import output directory", directory=True)
        remove_stale_staging(self.targets)
        if self.overwrite or self.append:
            return
        for target in self.targets:
            existing = layout_files(target)
            if existing:
                raise LayoutExistsError(
                    f"{existing[0]}: the output directory {target} already holds layout files "
                    f"({len(existing)}); pass --overwrite (overwrite=True) to replace them")

    def __enter__(self) -> Staging:
        self.check()
        try:
            for target in self.targets:
                with write_failures(target):
                    for parent in reversed([target, *target.parents]):
                        if not parent.exists():
                            parent.mkdir()
                            self._created.append(parent)
                    self.staged(target).mkdir()
        except BaseException:
            self.abort()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._committed:
            self.abort()
        if isinstance(exc, OutputError):  # name the file the user asked for, not its staged copy
            for target in self.targets:
                renamed = exc.named_at(self.staged(target), target)
                if renamed is not exc:
                    raise renamed from None

    def staged(self, target: Path) -> Path:
        """Where files meant for ``target`` are written until the commit."""
        return Path(os.path.abspath(target)) / self.token

    def commit(self) -> None:
        """Move every staged file into place (counts last); replace old layout files if asked.

        :data:`COMMIT_MARKER` brackets the moves: an import killed in between leaves it for the
        next import to find (:func:`remove_stale_staging`); an exception or Ctrl-C in between
        removes the files already moved (:meth:`abort`)."""
        marker = self.staged(self.targets[0]) / COMMIT_MARKER
        staged = [(p, t) for t in self.targets for p in sorted(self.staged(t).iterdir())]
        if self.append:
            for target in self.targets:
                _back_up(target, self.staged(target) / BACKUP_DIR)
        marker.write_bytes(b"")
        fsync_dir(marker.parent)
        self._committing = True
        if self.overwrite:
            _remove_layout(self.targets)
        elif self.append:  # the counts being replaced go first: until the new ones are in, nothing validates
            for path, target in staged:
                if _rank(path.name) == 2:
                    (target / path.name).unlink(missing_ok=True)
            for target in self.targets:
                fsync_dir(target)
        for rank in (0, 1, 2):
            for path, target in staged:
                if _rank(path.name) == rank:
                    os.replace(path, target / path.name)
            for target in self.targets:
                fsync_dir(target)
        marker.unlink()
        fsync_dir(marker.parent)
        self._committed = True
        for target in self.targets:
            shutil.rmtree(self.staged(target), ignore_errors=True)

    def abort(self) -> None:
        """Remove the staging directories, the files of an unfinished commit, and the directories
        this import created."""
        if self._committing and not self._committed:
            if self.append:
                _roll_back([(t, self.staged(t) / BACKUP_DIR) for t in self.targets])
            else:
                _remove_layout(self.targets)
        for target in self.targets:
            shutil.rmtree(self.staged(target), ignore_errors=True)
        for directory in reversed(self._created):
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty


def _remove_layout(targets: Iterable[Path]) -> None:
    """Delete the layout files of ``targets``, entity counts first (the layout stops validating)."""
    old = [p for t in targets for p in layout_files(t)]
    for path in sorted(old, key=lambda p: -(_rank(p.name) or 0)):
        path.unlink(missing_ok=True)
    for target in targets:
        if target.is_dir():
            fsync_dir(target)


def _back_up(target: Path, backup: Path) -> None:
    """Hard-link (else copy) every layout file of ``target`` into ``backup``, durably."""
    backup.mkdir(exist_ok=True)
    for path in layout_files(target):
        _link_or_copy(path, backup / path.name)
    fsync_dir(backup)


def _link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` becomes a hard link to ``src``, or a durable copy where the file system has no hard links."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
        fsync_path(dst)


def _roll_back(backups: list[tuple[Path, Path]]) -> None:
    """Put the backed-up layouts back (``(target, backup)`` pairs, the first backup's staging
    directory marked :data:`ROLLBACK_MARKER` first): the count files go, then the files the commit
    added, then every backed-up file is linked (else copied) back into place, counts last. The
    backups stay until the staging directories are removed, so a rollback cut short (a kill) is
    simply done again by the next import (:func:`remove_stale_staging`)."""
    if backups:
        marker = backups[0][1].parent / ROLLBACK_MARKER
        marker.write_bytes(b"")
        fsync_dir(marker.parent)
    for target, backup in backups:
        kept = {p.name for p in backup.iterdir()} if backup.is_dir() else set()
        for path in sorted(layout_files(target), key=lambda p: -(_rank(p.name) or 0)):
            if _rank(path.name) == 2 or path.name not in kept:
                path.unlink(missing_ok=True)
        fsync_dir(target)
    for rank in (0, 1, 2):
        for target, backup in backups:
            if backup.is_dir():
                for path in sorted(backup.iterdir()):
                    if _rank(path.name) == rank:
                        _restore(path, target / path.name)
        for target, _ in backups:
            fsync_dir(target)
    for _, backup in backups:  # done: the staging directories may go now (markers first)
        (backup.parent / COMMIT_MARKER).unlink(missing_ok=True)
        fsync_dir(backup.parent)


def _restore(backup: Path, path: Path) -> None:
    """``path`` becomes the backed-up file again (atomically; the backup stays)."""
    with contextlib.suppress(OSError):
        if os.path.samefile(backup, path):  # never replaced (rename() between two links of one file does nothing)
            return
    tmp = tmp_path_for(path)
    tmp.unlink(missing_ok=True)
    _link_or_copy(backup, tmp)
    os.replace(tmp, path)


def _dead_staging(targets: Iterable[Path]) -> dict[str, list[Path]]:
    """Staging directories of imports that are no longer running, by token."""
    by_token: dict[str, list[Path]] = {}
    for target in targets:
        if not target.is_dir():
            continue
        for path in target.iterdir():
            m = _STAGING_RE.match(path.name)
            if m and path.is_dir() and int(m["pid"]) != os.getpid() and not process_alive(int(m["pid"])):
                by_token.setdefault(path.name, []).append(path)
    return by_token


def interrupted_commits(targets: Iterable[Path]) -> list[Path]:
    """Staging directories of dead imports or appends that were killed while committing into
    ``targets`` (what :func:`remove_stale_staging` would clean up or roll back)."""
    return [d for dirs in _dead_staging(targets).values() if any((x / COMMIT_MARKER).exists() for x in dirs)
            for d in dirs]


def _marked_first(directory: Path) -> bool:
    """Sort key: the staging directory holding :data:`COMMIT_MARKER` first (False sorts first)."""
    return not (directory / COMMIT_MARKER).exists()


def remove_stale_staging(targets: Iterable[Path]) -> list[Path]:
    """Clean up after imports into ``targets`` that were killed; return what was removed.

    Their staging directories (``.pbgio-import-<pid>-<hex>``, the pid no longer running) go; where
    one of them still holds :data:`COMMIT_MARKER`, the import was killed while moving its files
    into place, and the layout files of the directories it was writing go first (they are an
    incomplete layout: its entity counts are missing or stale).
    """
    by_token = _dead_staging(targets)
    removed: list[Path] = []
    for dirs in by_token.values():
        if any((d / COMMIT_MARKER).exists() for d in dirs):
            interrupted = [d.parent for d in dirs]
            if all((d / BACKUP_DIR).is_dir() for d in dirs):  # an append: put the old layout back...
                unmoved = any(_rank(p.name) is not None for d in dirs for p in d.iterdir())
                if unmoved or any((d / ROLLBACK_MARKER).exists() for d in dirs):
                    removed += [p for t in interrupted for p in layout_files(t)]
                    _roll_back([(d.parent, d / BACKUP_DIR) for d in sorted(dirs, key=_marked_first)])
                # ...unless every file was moved in and no rollback began: the append is complete
            else:
                removed += [p for t in interrupted for p in layout_files(t)]
                _remove_layout(interrupted)
        for directory in dirs:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


class BucketSink:
    """One :class:`~pbgio.edges.BucketWriter` per bucket of the grid, sharing a buffer budget.

    Every bucket file is written on :meth:`close`, empty ones too, each with the same
    datasets (weights and feature lists wherever the edge path has them).
    """

    def __init__(self, directory: Path, grid: tuple[int, int], *, weights: bool, lhs_features: bool,
                 rhs_features: bool, budget_edges: int = BUFFER_BUDGET_EDGES) -> None:
        self.grid = grid
        buckets = grid[0] * grid[1]
        per_bucket = max(MIN_BUFFER_EDGES, min(WRITE_CHUNK_ELEMENTS, budget_edges // buckets))
        keep_open = buckets <= MAX_OPEN_BUCKETS
        self.writers = [BucketWriter(directory / naming.bucket_file(lhs, rhs), buffer_edges=per_bucket,
                                     keep_open=keep_open)
                        for lhs in range(grid[0]) for rhs in range(grid[1])]
        empty = np.zeros(0, np.int64)
        layout = EdgeBucket(empty, empty, empty, np.zeros(0, np.float32) if weights else None,
                            FeatureLists.empty(0) if lhs_features else None,
                            FeatureLists.empty(0) if rhs_features else None)
        for writer in self.writers:
            writer.append(layout)  # declares the datasets, so that empty buckets have them too
        self.counts = np.zeros(buckets, dtype=np.int64)

    def append(self, batch: EdgeBatch) -> None:
        if not len(batch):
            return
        n_rhs = self.grid[1]
        if len(self.writers) == 1:
            self.writers[0].append(_bucket(batch, None))
            self.counts[0] += len(batch)
            return
        bucket = batch.lhs_part * n_rhs + batch.rhs_part
        small = bucket.astype(np.uint16) if len(self.writers) <= 1 << 16 else bucket  # radix sort
        order = np.argsort(small, kind="stable")
        sizes = np.bincount(bucket, minlength=len(self.writers))
        self.counts += sizes
        start = 0
        for index in np.flatnonzero(sizes):
            end = start + int(sizes[index])
            self.writers[index].append(_bucket(batch, order[start:end]))
            start = end

    def copy_from(self, directory: Path, on_bucket: Callable[[int], None] | None = None) -> None:
        """Start every bucket with the edges of the bucket of the same name in ``directory`` (when
        there is one), read a block at a time; they are not counted in :attr:`counts`."""
        n_rhs = self.grid[1]
        for index, writer in enumerate(self.writers):
            source = directory / naming.bucket_file(index // n_rhs, index % n_rhs)
            if source.is_file():
                total = bucket_length(source)
                for start in range(0, total, writer.buffer_edges):
                    writer.append(read_bucket(source, edge_range=(start, start + writer.buffer_edges)))
            if on_bucket is not None:
                on_bucket(index)

    def close(self, on_bucket: Callable[[int], None] | None = None) -> dict[tuple[int, int], int]:
        """Write every bucket file (calling ``on_bucket`` after each); return each bucket's edge count."""
        for index, writer in enumerate(self.writers):
            writer.close()
            if on_bucket is not None:
                on_bucket(index)
        n_rhs = self.grid[1]
        return {(i // n_rhs, i % n_rhs): int(c) for i, c in enumerate(self.counts)}

    def abort(self) -> None:
        for writer in self.writers:
            writer.abort()


def _take(values: NDArray[np.int64], rows: NDArray[np.int64] | None) -> NDArray[np.int64]:
    return values if rows is None else values[rows]


def _take_features(feats: FeatureLists | None, rows: NDArray[np.int64] | None) -> FeatureLists | None:
    if feats is None or rows is None:
        return feats
    lengths = np.diff(feats.offsets)[rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    starts = np.repeat(feats.offsets[:-1][rows] - offsets[:-1], lengths)
    return FeatureLists(offsets, feats.data[starts + np.arange(offsets[-1], dtype=np.int64)])


def _bucket(batch: EdgeBatch, rows: NDArray[np.int64] | None) -> EdgeBucket:
    return EdgeBucket(
        rel=_take(batch.rel, rows), lhs=_take(batch.lhs, rows), rhs=_take(batch.rhs, rows),
        weight=None if batch.weight is None else (batch.weight if rows is None else batch.weight[rows]),
        lhs_features=_take_features(batch.lhs_features, rows),
        rhs_features=_take_features(batch.rhs_features, rows),
    )
