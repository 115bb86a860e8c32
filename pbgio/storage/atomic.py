"""Atomic, durable file writes: temp file in the same directory, fsync, rename.

A reader never sees a half-written file under its final name; after a crash
either the old file or the complete new one is there (plus, at worst, a
``*.tmp`` leftover that no reader looks at). On remote storage the file is
staged locally and uploaded as one object (:func:`pbgio.storage.staged`).

Inside :func:`together`, local files are moved into place only when the whole block
succeeds: a command that writes several outputs (an export) leaves all or none.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> try:
...     with together():
...         write_text(folder / "a.txt", "a")
...         raise OSError("the disk failed before b.txt")
... except OSError:
...     pass
>>> sorted(p.name for p in folder.iterdir())
[]
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from pbgio import confinement
from pbgio.errors import OutputError, PbgioError, UnsafeWriteError, os_error_code
from pbgio.storage import paths
from pbgio.storage.paths import AnyPath

TMP_SUFFIX = ".tmp"
_PENDING: contextvars.ContextVar[dict[Path, Path] | None] = contextvars.ContextVar("pending", default=None)


def tmp_path_for(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync directories
        fsync_path(path)


@contextlib.contextmanager
def write_failures(path: AnyPath) -> Iterator[None]:
    """Turn the OS's write failures raised inside into :class:`OutputError` naming ``path``: an
    OSError, or another library's error that carries the failed call's errno (h5py's when a flush
    fails, polars' when a sink fails: :func:`~pbgio.errors.os_error_code`)."""
    try:
        yield
    except PbgioError:
        raise
    except Exception as exc:
        if not isinstance(exc, OSError) and os_error_code(exc) is None:
            raise
        raise OutputError(str(path), exc) from None


@contextlib.contextmanager
def atomic_target(path: AnyPath) -> Iterator[Path]:
    """Yield a local temp path to write; on success fsync it and rename it to ``path`` (or, for a
    remote ``path``, upload it there). A failed write raises :class:`OutputError` and leaves no
    temp file behind."""
    if paths.is_remote(path):
        with paths.staged(path) as local:
            yield local
        return
    confinement.check_write(path, "output file")
    tmp = tmp_path_for(path)
    pending = _PENDING.get()
    try:
        with write_failures(path):
            create_new(tmp)
            yield tmp
            fsync_path(tmp)
            if pending is not None:
                pending[path] = tmp  # moved into place when together() ends
                return
            os.replace(tmp, path)
            fsync_dir(path.parent)
    except BaseException:
        _discard(tmp)
        raise


@contextlib.contextmanager
def together() -> Iterator[None]:
    """Hold back the renames of every local :func:`atomic_target` in the block until it succeeds,
    then make them one after the other; if the block fails, discard every file it wrote, so
    that none of its outputs appears. A nested ``together()`` joins the outer one."""
    if _PENDING.get() is not None:
        yield
        return
    pending: dict[Path, Path] = {}
    token = _PENDING.set(pending)
    try:
        yield
    except BaseException:
        for tmp in pending.values():
            _discard(tmp)
        raise
    finally:
        _PENDING.reset(token)
    try:
        for path, tmp in pending.items():
            with write_failures(path):
                os.replace(tmp, path)
    finally:
        for tmp in pending.values():  # the ones not moved, if a rename failed
            _discard(tmp)
    for folder in {path.parent for path in pending}:
        fsync_dir(folder)


def create_new(path: Path) -> None:
    """Create ``path`` as a new, empty regular file (a leftover of an earlier run, or a symbolic link
    a layout shipped under that name, is removed first, never followed): the temporary file a writer
    then opens by name is one this process made."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # removes a link itself, never its target
    with contextlib.suppress(FileNotFoundError):  # no folder: the writer fails as it would have
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))


def make_dirs(path: AnyPath, what: str = "output directory") -> None:
    """``path`` and its missing parents made (``mkdir -p``), after
    :func:`pbgio.confinement.check_write`: in a command, only where it may write and never through
    a symbolic link of the layout (remote paths were checked when they were resolved)."""
    if not paths.is_remote(path):
        confinement.check_write(path, what, directory=True)
    path.mkdir(parents=True, exist_ok=True)


def real_dir(path: AnyPath, what: str) -> None:
    """Make the subdirectory ``path`` (``best/``, ``epoch_3/``, a staging directory: one that pbg
    itself makes, never a link) if it is missing, and refuse it when something else stands there: a
    symbolic link (where it leads would receive the files; pbg never writes through a link) or a
    file. Checked in and out of a command, since pbg never makes these links itself."""
    if paths.is_remote(path):  # no links on object stores
        path.mkdir(parents=True, exist_ok=True)
        return
    make_dirs(path.parent, what)
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        raise UnsafeWriteError(str(path), f"the {what} is a symbolic link (to {os.readlink(path)}); pbg never writes "
                                          "through a link a layout holds: remove it")
    if not stat.S_ISDIR(mode):
        raise UnsafeWriteError(str(path), f"expected the {what} to be a directory, found another kind of file")


def open_append(path: Path, what: str) -> int:
    """A descriptor of the regular file ``path`` opened for appending (created if missing), never
    through a symbolic link (``O_NOFOLLOW``: a link there is refused, not followed) and never a FIFO
    or device (opened without blocking, then checked)."""
    confinement.check_write(path, what)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeWriteError(str(path), f"the {what} is a symbolic link (to {_link_target(path)}); pbg never "
                                              "writes through a link a layout holds: remove it") from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise UnsafeWriteError(str(path), f"expected the {what} to be a regular file, found a FIFO") from None
        raise
    check_regular(fd, path, what)
    return fd


def check_regular(fd: int, path: object, what: str) -> None:
    """Close ``fd`` and raise :class:`UnsafeWriteError` unless it is a regular file."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnsafeWriteError(str(path), f"expected the {what} to be a regular file, found "
                                          f"{'a FIFO' if stat.S_ISFIFO(mode) else 'a special file'}")


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def remove_file(path: AnyPath, what: str) -> None:
    """Delete ``path`` (a link itself, never its target), after :func:`pbgio.confinement.check_write`:
    in a command, only inside the directories it may write, reached without links."""
    if paths.is_remote(path):
        path.unlink(missing_ok=True)
        return
    confinement.check_write(path, what)
    path.unlink(missing_ok=True)


def _discard(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def write_text(path: AnyPath, text: str) -> None:
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: AnyPath, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a picture, a blob), as :func:`write_text` writes text."""
    with atomic_target(path) as tmp:
        tmp.write_bytes(data)


def copy_tree(source: AnyPath, target: AnyPath) -> list[str]:
    """Copy every file under ``source`` to ``target`` (either may be remote); return the relative
    names copied."""
    names = []
    for rel in _walk(source):
        copy_file(source / rel, target / rel)
        names.append(rel)
    return names


def _walk(root: AnyPath, prefix: str = "") -> Iterator[str]:
    entries: list[AnyPath] = paths.children(root)
    for entry in entries:
        rel = f"{prefix}{entry.name}"
        if entry.is_dir():
            yield from _walk(entry, f"{rel}/")
        else:
            yield rel


def copy_file(source: AnyPath, target: AnyPath) -> None:
    """Copy one file between any two locations (atomic at the target)."""
    if not paths.is_remote(target):
        make_dirs(target.parent)
        with atomic_target(target) as tmp:
            if paths.is_remote(source):
                paths.remote_call(source, "download", lambda: source.fs.get_file(source.path, str(tmp)))
            else:
                shutil.copyfile(source, tmp)
        return
    if paths.is_remote(source):
        with paths.staged(target) as local:
            paths.remote_call(source, "download", lambda: source.fs.get_file(source.path, str(local)))
        return
    paths.upload(source, target)
