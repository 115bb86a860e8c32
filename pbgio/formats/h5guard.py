"""Damaged HDF5 internals as typed errors, for code that works on an open file.

:func:`pbgio.formats.h5.open_h5` turns a file that cannot be opened into a
:class:`~pbgio.errors.CorruptFileError`; a file that opens but whose object headers, B-trees
or heaps are damaged fails later, inside h5py, with a ``RuntimeError``, ``KeyError``,
``OSError`` or ``ValueError`` from HDF5. :func:`h5_guard`, which ``open_h5`` applies to every
file it opens for reading, turns exactly those (the ones raised inside h5py) into the same
``h5-unreadable`` error; an exception raised by pbgio's own code passes unchanged.

A file that opens may still reach outside itself, or claim more than it holds:
:func:`check_contained`, which ``open_h5`` runs on every file it opens for reading before anything
else reads it, walks its links without following any and refuses external and user-defined links,
external raw storage and virtual datasets (``h5-external-link``), and filtered chunks past their
bounds (``h5-size-bound``).

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "edges_0_0.h5"
>>> with h5_guard(path):
...     raise RuntimeError("not from h5py")
Traceback (most recent call last):
...
RuntimeError: not from h5py
>>> with h5py.File(path, "w") as f:
...     f["lhs"] = h5py.ExternalLink("/etc/passwd", "/x")
>>> with h5py.File(path, "r") as f:
...     check_contained(f, path)
Traceback (most recent call last):
...
pbgio.errors.FormatError: .../edges_0_0.h5: lhs: expected data inside this file, found an external link to ...
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator
from types import TracebackType

import h5py
import numpy as np

from pbgio import storage
from pbgio.checks import hdf5 as checks_hdf5
from pbgio.errors import CorruptFileError, FormatError, PbgioError

_H5PY_ERRORS = (RuntimeError, KeyError, OSError, ValueError, TypeError, IndexError, SystemError)


def raised_by_h5py(tb: TracebackType | None) -> bool:
    """Whether the innermost frame of a traceback is h5py's (Python or Cython)."""
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return False
    name = last.tb_frame.f_code.co_filename
    return f"h5py{os.sep}" in name or name.startswith("h5py") or name.endswith(".pyx")


@contextlib.contextmanager
def h5_guard(path: storage.AnyPath, dataset: str | None = None) -> Iterator[None]:
    """Turn an HDF5 failure raised inside h5py into a :class:`CorruptFileError` naming ``path``."""
    try:
        yield
    except PbgioError:
        raise
    except _H5PY_ERRORS as exc:
        if not raised_by_h5py(exc.__traceback__):
            raise
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CorruptFileError(checks_hdf5.unreadable(
            storage.display(path), dataset,
            f"expected intact HDF5 structures, found damaged ones ({reason[:200]})")) from None


def check_contained(handle: h5py.File, path: storage.AnyPath) -> list[h5py.h5o.ObjectID]:
    """Raise :class:`FormatError` when the open file ``handle`` (``path``) reads another file or claims
    more than it can hold. Every link is looked at without being followed, and every dataset is checked
    before its data or its extent is touched (a virtual dataset's extent alone can open its source
    files, and a FIFO among them would hang the reader):

    - an external link or a user-defined link: ``h5-external-link`` (soft links resolve inside the
      file; a dangling or cyclic one fails where it is read);
    - a dataset with external raw storage, or a virtual dataset: ``h5-external-link``;
    - a filtered chunked dataset whose chunk or claimed size is past its bound: ``h5-size-bound``.

    Metadata only, and once per file: HDF5 lists the links (:func:`_tree`), each dataset is opened once
    (a plain run of bytes inside the file needs nothing more), and a local file found contained is
    remembered until it changes (:func:`_identity`). Returns the first :data:`HELD_DATASETS` datasets
    it opened, for the caller to hold open while it reads the file.
    """
    key = _identity(handle)
    if key is not None and key in _contained:
        return []
    shown = storage.display(path)
    leaves = _tree(handle, shown)
    held: list[h5py.h5o.ObjectID] = []
    for where, obj in (_walk(handle, shown) if leaves is None else _opened(handle, leaves)):
        if isinstance(obj, h5py.h5d.DatasetID):
            if obj.get_offset() is None:
                _check_dataset(shown, where, obj)  # not a plain run of bytes inside this file
            if len(held) < HELD_DATASETS:
                held.append(obj)
    if key is not None:
        if len(_contained) > 4096:
            _contained.clear()
        _contained.add(key)
    return held


HELD_DATASETS = 64
"""Datasets :func:`check_contained` returns open, for ``open_h5`` to hold while the file is in use: HDF5
shares an open dataset with later opens of it, so a reader's own open costs a fraction of the first (a
bucket's datasets are opened once, not twice: the walk adds 1.5% to reading one, not 11%). At most this
many: HDF5 keeps about 16 KB for each open dataset, and a file may hold millions."""
_contained: set[tuple[int, ...]] = set()  # device, inode, size, mtime, ctime of files found contained
_SETTLED_NS = 2_000_000_000
"""A file whose last change is older than this may be remembered: a later change gets a later change
time, whatever the granularity of the file system's clock (git's "racily clean" entries)."""


def _identity(handle: h5py.File) -> tuple[int, ...] | None:
    """Device, inode, size and times of the file HDF5 has open (its own descriptor: the file read, even if
    its name was replaced since), when it may be remembered: read through HDF5's POSIX driver (not a
    remote file, read through a file object) and last changed more than two seconds ago."""
    if handle.driver != "sec2":
        return None
    info = os.fstat(int(handle.id.get_vfd_handle()))
    if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) < _SETTLED_NS:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _tree(handle: h5py.File, shown: str) -> list[bytes] | None:
    """The paths of the hard links that lead to no further link (datasets, mostly), listed by HDF5
    (``H5Lvisit``: no link is followed but hard links to groups); ``h5-external-link`` for an external or
    user-defined link. None when an object is reached twice (a second hard link to it, or a cycle):
    HDF5 is stopped before it goes round, and :func:`_walk` takes over."""
    seen = {h5py.h5o.get_info(handle.id).addr}
    hard: list[bytes] = []
    foreign: list[tuple[bytes, int]] = []

    def visit(name: bytes, info: h5py.h5l.LinkInfo) -> bool | None:
        if info.type == h5py.h5l.TYPE_HARD:
            if info.u in seen:
                return True
            seen.add(info.u)
            hard.append(name)
        elif info.type != h5py.h5l.TYPE_SOFT:
            foreign.append((name, info.type))
            return True
        return None

    stopped = handle.id.links.visit(visit, info=True)
    if foreign:
        raise _foreign_link(shown, handle.id, *foreign[0])
    if stopped:
        return None
    parents = {name.rpartition(b"/")[0] for name in hard}
    return [name for name in hard if name not in parents]


def _opened(handle: h5py.File, leaves: list[bytes]) -> Iterator[tuple[str, h5py.h5o.ObjectID]]:
    for raw in leaves:
        yield _text(raw), h5py.h5o.open(handle.id, raw)


def _walk(handle: h5py.File, shown: str) -> Iterator[tuple[str, h5py.h5o.ObjectID]]:
    """Every object of a file some object of which is linked twice: groups walked one by one, each once
    (by address), links listed without being followed (:func:`_tree` has refused the foreign ones
    reached before the second link; the rest are refused here)."""
    seen = {h5py.h5o.get_info(handle.id).addr}
    pending: list[tuple[h5py.h5g.GroupID, str]] = [(handle.id, "")]
    while pending:
        group, prefix = pending.pop()
        links: list[tuple[bytes, int, int]] = []
        group.links.iterate(functools.partial(_copy_link, links), info=True)
        for raw, kind, address in links:
            if kind == h5py.h5l.TYPE_SOFT:
                continue
            if kind != h5py.h5l.TYPE_HARD:
                raise _foreign_link(shown, group, raw, kind, prefix)
            if address in seen:
                continue
            seen.add(address)
            obj = h5py.h5o.open(group, raw)
            if isinstance(obj, h5py.h5g.GroupID):
                pending.append((obj, f"{prefix}{_text(raw)}/"))
            yield prefix + _text(raw), obj


def _copy_link(links: list[tuple[bytes, int, int]], name: bytes, info: h5py.h5l.LinkInfo) -> None:
    links.append((name, info.type, info.u))  # h5py hands every call the same LinkInfo: copy its fields


def _text(name: bytes | str) -> str:
    return name if isinstance(name, str) else name.decode("utf-8", "backslashreplace")


def _foreign_link(shown: str, group: h5py.h5g.GroupID, raw: bytes, kind: int, prefix: str = "") -> FormatError:
    where = prefix + _text(raw)
    if kind == h5py.h5l.TYPE_EXTERNAL:
        target, obj = group.links.get_val(raw)
        return FormatError(checks_hdf5.external_link(shown, where, "an external link to", _text(target), _text(obj)))
    return FormatError(checks_hdf5.external_link(shown, where, f"a user-defined link (type {kind}) to",
                                                 "a target only its link class resolves"))


def _check_dataset(shown: str, where: str, ds: h5py.h5d.DatasetID) -> None:
    plist = ds.get_create_plist()
    if plist.get_external_count():
        raise FormatError(checks_hdf5.external_link(shown, where, "external raw storage in",
                                                    _text(plist.get_external(0)[0])))
    layout = plist.get_layout()
    if layout == h5py.h5d.VIRTUAL:
        count = plist.get_virtual_count()
        raise FormatError(checks_hdf5.external_link(
            shown, where, "a virtual dataset mapping", _text(plist.get_virtual_filename(0)) if count else "no source",
            _text(plist.get_virtual_dsetname(0)) if count else None))
    if layout != h5py.h5d.CHUNKED or not plist.get_nfilters():
        return
    itemsize = ds.get_type().get_size()
    issue = checks_hdf5.size_bound(
        shown, where, chunk_bytes=int(np.prod(plist.get_chunk(), dtype=object)) * itemsize,
        claimed=int(np.prod(ds.shape, dtype=object)) * itemsize, stored=int(ds.get_storage_size()),
        compressing=checks_hdf5.compressing_filters([plist.get_filter(i)[0] for i in range(plist.get_nfilters())]))
    if issue is not None:
        raise FormatError(issue)
