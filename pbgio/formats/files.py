"""Every local file a layout hands pbg is opened here: a regular file, reached through links only
inside the layout, read whole only within a size bound (docs/security.md).

- :func:`check_input`: what every reader asks before it opens a file by name (HDF5 opens files by
  name): the file's links stay inside the layout (:func:`pbgio.confinement.read_escape`,
  ``layout-link-outside``) and it is a regular file, not a FIFO, device or socket
  (``file-not-regular``).
- :func:`open_input`: the file opened for reading bytes after those checks, the kind of file checked
  on the open descriptor itself (a FIFO is opened without waiting for a writer, then refused).
- :func:`read_bytes` / :func:`read_text`: a file read whole, at most ``limit`` bytes
  (``file-too-large``), whatever its size claims: a count, a version file, a config.
- :func:`check_input_dir`: a directory of the layout (an entity path, an edge path, a checkpoint)
  before it is listed.

Remote files pass through to :func:`pbgio.storage.open_binary` (their URL was checked when it was
resolved, :func:`pbgio.confinement.url_refusal`); the size bound holds for them too.

>>> import os, tempfile
>>> from pathlib import Path
>>> folder = tempfile.mkdtemp()
>>> with open(os.path.join(folder, "count.txt"), "w") as f:
...     _ = f.write("12\\n")
>>> read_text(Path(folder) / "count.txt", "an entity count", limit=64)
'12\\n'
>>> os.mkfifo(os.path.join(folder, "fifo.txt"))
>>> read_text(Path(folder) / "fifo.txt", "an entity count", limit=64)
Traceback (most recent call last):
...
pbgio.errors.FormatError: .../fifo.txt: expected a regular file, found a FIFO [file-not-regular]
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import BinaryIO

from pbgio import confinement, storage
from pbgio.checks import files as checks_files
from pbgio.errors import FormatError, MissingArtifactError

TEXT_LIMIT = 1 << 20
"""Bytes of a small text file read whole (an entity count, a version file): 1 MiB, far above any real one."""
READ_BLOCK = 1 << 20
"""Bytes read at a time by :func:`read_bytes`."""
CONFIG_LIMIT = 64 << 20
"""Bytes of a config file read whole (JSON): 64 MiB, a config of a million relations."""

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a regular file", "a FIFO" …).

    >>> kind_of(os.stat("/dev/null").st_mode)
    'a character device'
    """
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def _escape(path: storage.AnyPath, *, directory: bool = False) -> None:
    if storage.is_remote(path):
        return
    target = confinement.read_escape(path)
    if target is not None:
        raise FormatError(checks_files.link_outside(storage.display(path), target, directory=directory))


def check_input(path: storage.AnyPath, what: str) -> None:
    """Raise unless the local file ``path`` may be read as ``what``: its links stay inside the layout
    (``layout-link-outside``) and it is a regular file (``file-not-regular``; a missing file is a
    :class:`~pbgio.errors.MissingArtifactError`). Remote files pass."""
    if storage.is_remote(path):
        return
    _escape(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise MissingArtifactError(storage.display(path), what, found=storage.found_at(path)) from None
    except OSError as exc:
        raise MissingArtifactError(storage.display(path), what, found=storage.found_at(path)
                                   if exc.errno != errno.ELOOP else "a symbolic link loop") from None
    if not stat.S_ISREG(mode):
        raise FormatError(checks_files.not_regular(storage.display(path), kind_of(mode)))


def check_input_dir(path: storage.AnyPath, what: str) -> None:
    """Raise ``layout-link-outside`` when the local directory ``path`` (``what``) leads out of the
    layout; a missing directory passes (readers say it is missing)."""
    del what  # the rule's message says "directory"
    _escape(path, directory=True)


def open_input(path: storage.AnyPath, what: str) -> BinaryIO:
    """``path`` opened for reading bytes, after :func:`check_input`'s checks; the kind of file is
    checked again on the open descriptor (opened without blocking, so a FIFO cannot hang it)."""
    if storage.is_remote(path):
        return storage.open_binary(path, what)
    _escape(path)
    try:
        # The file object owns the descriptor at once and closes it once: an interrupt (Ctrl-C) that
        # lands while it is handed over can never close it twice and turn into EBADF.
        f = open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb")  # noqa: SIM115
    except FileNotFoundError:
        raise MissingArtifactError(storage.display(path), what) from None
    try:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise FormatError(checks_files.not_regular(storage.display(path), kind_of(mode)))
        fcntl.fcntl(f.fileno(), fcntl.F_SETFL, fcntl.fcntl(f.fileno(), fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        f.close()
        raise
    return f


def read_bytes(path: storage.AnyPath, what: str, *, limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of the file ``path`` (``what``), at most ``limit`` of them: a larger file is refused
    (``file-too-large``) before more than ``limit + 1`` bytes are read."""
    pieces: list[bytes] = []
    held = 0
    with open_input(path, what) as f:
        while held <= limit:  # a block at a time: read(limit + 1) would reserve the whole bound at once
            piece = f.read(min(READ_BLOCK, limit + 1 - held))
            if not piece:
                break
            pieces.append(piece)
            held += len(piece)
    data = b"".join(pieces)
    if len(data) > limit:
        size = None if storage.is_remote(path) else _size(path)
        raise FormatError(checks_files.too_large(storage.display(path), size, limit, what))
    return data


def read_text(path: storage.AnyPath, what: str, *, limit: int = TEXT_LIMIT, encoding: str = "utf-8") -> str:
    """:func:`read_bytes` decoded (``UnicodeDecodeError`` for bytes of another encoding, as
    :meth:`pathlib.Path.read_text` raises)."""
    return read_bytes(path, what, limit=limit).decode(encoding)


def _size(path: storage.AnyPath) -> int | None:
    try:
        return os.stat(str(path)).st_size
    except OSError:
        return None
