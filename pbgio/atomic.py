"""Atomic, durable file writes: temp file in the same directory, fsync, rename.

A reader never sees a half-written file under its final name; after a crash
either the old file or the complete new one is there (plus, at worst, a
``*.tmp`` leftover that no reader looks at). On remote storage the file is
staged locally and uploaded as one object (:func:`pbgio.storage.staged`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from pbgio import storage
from pbgio.errors import OutputError, PbgioError
from pbgio.storage import AnyPath

TMP_SUFFIX = ".tmp"


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
def atomic_target(path: AnyPath) -> Iterator[Path]:
    """Yield a local temp path to write; on success fsync it and rename it to ``path`` (or, for a
    remote ``path``, upload it there)."""
    if storage.is_remote(path):
        with storage.staged(path) as local:
            yield local
        return
    tmp = tmp_path_for(path)
    try:
        tmp.unlink(missing_ok=True)
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except PbgioError:
        _discard(tmp)
        raise
    except (OSError, RuntimeError) as exc:  # h5py raises RuntimeError when a flush on close fails
        _discard(tmp)
        if isinstance(exc, RuntimeError) and "errno" not in str(exc):
            raise
        raise OutputError(str(path), exc) from None
    except BaseException:
        _discard(tmp)
        raise


def _discard(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def write_text(path: AnyPath, text: str) -> None:
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
