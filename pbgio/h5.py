"""HDF5 access with typed errors: the only module that opens .h5 files.

A truncated file, a file of another format or a missing file becomes a
:class:`~pbgio.errors.CorruptFileError` / :class:`~pbgio.errors.MissingArtifactError`
naming the file, never a raw h5py ``OSError``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from pbgio.errors import CorruptFileError, MissingArtifactError, VersionError
from pbgio.spec import FORMAT_VERSION, FORMAT_VERSION_ATTR
from pbgio.spec.rules import rule


@contextlib.contextmanager
def open_h5(path: Path, mode: str = "r") -> Iterator[h5py.File]:
    """Open an HDF5 file; errors name the file and the rule it breaks."""
    if mode == "r" and not path.is_file():
        raise MissingArtifactError(str(path), "HDF5 file")
    try:
        handle = h5py.File(path, mode)
    except OSError as exc:
        raise CorruptFileError(rule("h5-unreadable").issue(
            str(path), None, f"expected an HDF5 file, found an unreadable file ({_h5_reason(exc)})"
        )) from None
    try:
        yield handle
    finally:
        handle.close()


def _h5_reason(exc: OSError) -> str:
    text = str(exc)
    m = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", text)
    if m:
        return f"truncated: {m[1]} of {m[2]} bytes present"
    if "file signature not found" in text:
        return "no HDF5 signature: not an HDF5 file"
    m = re.search(r"\((.+)\)", text)
    return m[1] if m else text or type(exc).__name__


def format_version(handle: h5py.File) -> Any:
    return handle.attrs.get(FORMAT_VERSION_ATTR)


def check_format_version(handle: h5py.File, path: Path) -> None:
    """Raise :class:`VersionError` unless the root says ``format_version == 1``."""
    found = format_version(handle)
    if not _is_version(found):
        raise VersionError(rule("h5-format-version").issue(
            str(path), None, f"expected root attribute {FORMAT_VERSION_ATTR}={FORMAT_VERSION}, "
            f"found {'none' if found is None else repr(found)}"
        ))


def _is_version(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        if value.size != 1:
            return False
        value = value.reshape(()).item()
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and int(value) == FORMAT_VERSION


def write_format_version(handle: h5py.File) -> None:
    handle.attrs[FORMAT_VERSION_ATTR] = np.int64(FORMAT_VERSION)


def attr_str(handle: h5py.File, name: str) -> str | None:
    value = handle.attrs.get(name)
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def attr_int(handle: h5py.File, name: str) -> int | None:
    value = handle.attrs.get(name)
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        return int(value)
    return None
