"""Damaged HDF5 internals as typed errors, for code that works on an open file.

:func:`pbgio.formats.h5.open_h5` turns a file that cannot be opened into a
:class:`~pbgio.errors.CorruptFileError`; a file that opens but whose object headers, B-trees
or heaps are damaged fails later, inside h5py, with a ``RuntimeError``, ``KeyError``,
``OSError`` or ``ValueError`` from HDF5. :func:`h5_guard`, which ``open_h5`` applies to every
file it opens for reading, turns exactly those (the ones raised inside h5py) into the same
``h5-unreadable`` error; an exception raised by pbgio's own code passes unchanged.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "edges_0_0.h5"
>>> with h5_guard(path):
...     raise RuntimeError("not from h5py")
Traceback (most recent call last):
...
RuntimeError: not from h5py
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import TracebackType

from pbgio import storage
from pbgio.checks import hdf5 as checks_hdf5
from pbgio.errors import CorruptFileError, PbgioError

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
