"""HDF5 access with typed errors: the only module that opens .h5 files.

A truncated file, a file of another format or a missing file becomes a
:class:`~pbgio.errors.CorruptFileError` / :class:`~pbgio.errors.MissingArtifactError`
naming the file, never a raw h5py ``OSError``.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import re
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, cast

import h5py
import numpy as np

from pbgio import storage
from pbgio.checks import hdf5 as checks_hdf5
from pbgio.checks import raise_first
from pbgio.errors import CorruptFileError, VersionError
from pbgio.formats.files import check_input
from pbgio.formats.h5guard import check_contained, h5_guard
from pbgio.formats.h5heap import check_global_heaps
from pbgio.spec import FORMAT_VERSION, FORMAT_VERSION_ATTR


@contextlib.contextmanager
def open_h5(path: storage.AnyPath, mode: str = "r") -> Iterator[h5py.File]:
    """Open an HDF5 file; errors name the file and the rule it breaks.

    A remote file opens for reading only, through ranged reads (:func:`pbgio.storage.open_binary`);
    writers stage a local file (:func:`pbgio.storage.atomic.atomic_target`). While a file opened for
    reading is in use, damaged structures that h5py meets become a ``CorruptFileError`` too
    (:func:`pbgio.formats.h5guard.h5_guard`). A local file is read only as
    :func:`pbgio.formats.files.check_input` allows (a regular file, its links inside the layout); a file
    opened for reading is refused before anything reads it when it reaches another file or claims more
    than it can hold (:func:`pbgio.formats.h5guard.check_contained`).
    """
    remote = storage.is_remote(path)
    if remote and mode != "r":
        raise ValueError(f"{storage.display(path)}: remote HDF5 files open read-only; stage writes locally")
    if mode == "r" and not remote:
        check_input(path, "HDF5 file")
    source = storage.open_binary(path, "HDF5 file") if remote else None
    try:
        try:
            handle = h5py.File(source if source is not None else path, mode)
        except OSError as exc:
            raise CorruptFileError(checks_hdf5.unreadable(
                storage.display(path), None,
                f"expected an HDF5 file, found an unreadable file ({_h5_reason(exc)})")) from None
        except storage.StorageError:
            raise  # a read of the store failed for good; it names the object already
        except Exception as exc:
            if source is None:
                raise
            raise storage.StorageError(path, f"read: {storage.describe_failure(exc)}") from None
        try:
            with h5_guard(path) if mode == "r" else contextlib.nullcontext():
                held = check_contained(handle, path) if mode == "r" else []  # open until the file closes
                yield handle
                del held
        finally:
            handle.close()
    finally:
        if source is not None:
            source.close()


def _h5_reason(exc: OSError) -> str:
    text = str(exc)
    m = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", text)
    if m:
        return f"truncated: {m[1]} of {m[2]} bytes present"
    if "file signature not found" in text:
        return "no HDF5 signature: not an HDF5 file"
    m = re.search(r"\((.+)\)", text)
    return m[1] if m else text or type(exc).__name__


def check_written(ds: h5py.Dataset, path: storage.AnyPath) -> None:
    """Raise :class:`CorruptFileError` unless the file stores every element ``ds`` claims.

    HDF5 reads the never-written part of a dataset as fill values, so a 2 KB file whose datasets
    claim 10^12 rows would stream terabytes of zeros: a truncated file in disguise. The check reads
    only metadata (chunk index, storage size), before anything of the claimed size is read or
    allocated.
    """
    claimed = int(ds.size) * ds.dtype.itemsize
    if claimed == 0:
        return
    # HDF5 gives an offset only to contiguous data in this file (no external storage, no filter): the
    # common case, answered without the creation property list (a copy: a third of this check's time)
    offset = ds.id.get_offset()
    layout = h5py.h5d.CONTIGUOUS
    if offset is None:
        plist = ds.id.get_create_plist()
        layout = plist.get_layout()
        if layout == h5py.h5d.COMPACT:
            return  # stored in the object header, whole
        if plist.get_external_count() or layout not in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED):
            kind = "external" if plist.get_external_count() else "virtual"
            raise _unwritten(ds, path, f"expected data stored in the file, found {kind} storage")
    stored = int(ds.id.get_storage_size())
    if layout == h5py.h5d.CONTIGUOUS:
        if offset is None or stored < claimed:
            raise _unwritten(ds, path, f"expected {claimed:,} bytes of data ({_rows(ds):,} rows), found "
                             f"{stored:,} written (a truncated file: the rest would read as fill values)")
    else:
        chunks = ds.chunks or ds.shape
        grid = int(np.prod([-(-size // chunk) for size, chunk in zip(ds.shape, chunks, strict=True)]))
        written = int(ds.id.get_num_chunks())
        if written < grid:
            raise _unwritten(ds, path, f"expected {grid:,} chunks of data ({_rows(ds):,} rows), found "
                             f"{written:,} written (a truncated file: the rest would read as fill values)")
    size = int(h5py.h5i.get_file_id(ds.id).get_filesize())  # not ds.file: a File object costs more than the check
    if stored > size:
        raise _unwritten(ds, path, f"expected data within the file's {size:,} bytes, found {stored:,} "
                         "bytes claimed (a truncated file)")


def _rows(ds: h5py.Dataset) -> int:
    return int(ds.shape[0]) if ds.ndim else 1


def _unwritten(ds: h5py.Dataset, path: storage.AnyPath, message: str) -> CorruptFileError:
    return CorruptFileError(checks_hdf5.unreadable(storage.display(path), link_name(ds.name).lstrip("/"), message))


ROW_CHUNK_BYTES_ENV = "PBG_ROW_CHUNK_BYTES"
"""The environment variable that sets :func:`row_chunk_bytes` (bytes, e.g. ``PBG_ROW_CHUNK_BYTES=16777216``)."""
DEFAULT_ROW_CHUNK_BYTES = 64 << 20
"""Bytes of rows a stage that streams a table reads at a time (export, index build, validation, neighbours,
predict's scans): its memory beside what it builds, whatever the size of a partition."""


def row_chunk_bytes() -> int:
    """Bytes of rows read at a time: ``PBG_ROW_CHUNK_BYTES`` when set (at least 1), else 64 MiB.

    >>> row_chunk_bytes() == int(os.environ.get(ROW_CHUNK_BYTES_ENV, DEFAULT_ROW_CHUNK_BYTES))
    True
    """
    value = os.environ.get(ROW_CHUNK_BYTES_ENV)
    if not value:
        return DEFAULT_ROW_CHUNK_BYTES
    try:
        size = int(value)
    except ValueError:
        raise ValueError(f"{ROW_CHUNK_BYTES_ENV}: expected a number of bytes, found {value!r}") from None
    if size < 1:
        raise ValueError(f"{ROW_CHUNK_BYTES_ENV}: expected at least 1 byte, found {size}")
    return size


def rows_per_chunk(row_bytes: int) -> int:
    """Rows of ``row_bytes`` bytes each in one chunk of :func:`row_chunk_bytes` (at least one).

    >>> rows_per_chunk(400) == max(1, row_chunk_bytes() // 400)
    True
    """
    return max(1, row_chunk_bytes() // max(1, row_bytes))


def read_row_chunks(ds: h5py.Dataset, path: storage.AnyPath) -> Iterator[tuple[int, np.ndarray[Any, Any]]]:
    """``(first row, rows)`` of ``ds`` in order, :func:`rows_per_chunk` rows at a time (h5py slices),
    after :func:`check_written`: memory holds one chunk, whatever the dataset's size."""
    check_written(ds, path)
    total = int(ds.shape[0])
    step = rows_per_chunk(int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize)
    for start in range(0, total, step):
        yield start, np.asarray(ds[start:min(total, start + step)])


class TableRows(Protocol):
    """A table read row by row: ``array`` (every row; its shape and dtype, and whole-table reads),
    ``take`` (the rows asked for) and ``release`` (what ``array`` holds in memory, let go)."""

    array: np.ndarray[Any, Any]

    def take(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]: ...

    def release(self) -> None: ...


class InMemoryRows:
    """:class:`TableRows` over a table read whole (a remote or chunked file)."""

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array

    def take(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return self.array[np.asarray(rows, dtype=np.int64)]

    def release(self) -> None:
        """Nothing: the table is held whole."""


MAPPED_SHARE = 1 / 8
"""The share of a table's rows from which :meth:`MappedRows.take` reads through the map: a call per row
costs ten times a copy from the page cache (about 2 µs a row against 0.2 on a 2-core machine: ranking
against every entity reads the whole table at every batch); fewer rows are read one by one, so that
sampled evaluation does not map the table."""


class MappedRows:
    """A table that HDF5 stores as one run of plain bytes in a local file, for reading rows here and
    there: :attr:`array`, a read-only memory map of it (pages read when touched; the kernel maps
    64 KiB or more around each, so touching a few thousand scattered rows maps most of a table),
    and :meth:`take`, which reads the rows asked for into memory: exactly those (``pread``), or, when
    they are :data:`MAPPED_SHARE` of the table or more (ranking against every entity asks for all
    of it at every batch), through the map, whose pages the kernel would read around them anyway."""

    def __init__(self, path: Path, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
        self.path = path
        self.offset = offset
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115  # held: rows stay readable if a commit removes the file
        weakref.finalize(self, self._file.close)
        self._mapping = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self.array: np.ndarray[Any, Any] = np.frombuffer(
            self._mapping, dtype=dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)
        self._row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize

    def take(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Rows ``rows`` (any order, repeats allowed) read from the file, each distinct row once."""
        unique, inverse = np.unique(np.asarray(rows, dtype=np.int64), return_inverse=True)
        if len(unique) and (unique[0] < 0 or unique[-1] >= len(self.array)):
            bad = int(unique[0] if unique[0] < 0 else unique[-1])
            raise IndexError(f"{self.path}: row {bad} asked for, outside its {len(self.array)} rows")
        if len(unique) >= MAPPED_SHARE * len(self.array):  # one copy, not a call per row
            return np.take(self.array, unique[inverse.reshape(-1)], axis=0)
        out = np.empty((len(unique), *self.array.shape[1:]), dtype=self.array.dtype)
        descriptor = self._file.fileno()
        for position, row in enumerate(unique.tolist()):
            os.preadv(descriptor, [out[position]], self.offset + row * self._row_bytes)
        return out[inverse.reshape(-1)]

    def release(self) -> None:
        """Let the pages of :attr:`array` touched so far go from this process's memory (they are read
        again, from the page cache, when touched next)."""
        self._mapping.madvise(mmap.MADV_DONTNEED)


def mapped_rows(ds: h5py.Dataset, path: storage.AnyPath) -> MappedRows | None:
    """``ds`` as :class:`MappedRows` when HDF5 stores it as one run of plain bytes (contiguous, no
    filter, native byte order, in a local file), after :func:`check_written`; else None."""
    check_written(ds, path)
    if storage.is_remote(path) or ds.size == 0:
        return None
    plist = ds.id.get_create_plist()
    offset = ds.id.get_offset()
    if plist.get_layout() != h5py.h5d.CONTIGUOUS or plist.get_nfilters() or offset is None or not ds.dtype.isnative:
        return None
    return MappedRows(Path(path), int(offset), ds.dtype, tuple(ds.shape))


def read_whole(ds: h5py.Dataset, path: storage.AnyPath) -> np.ndarray[Any, Any]:
    """All of ``ds`` in memory, after :func:`check_written` (small datasets: parameters, blobs)."""
    check_written(ds, path)
    return cast(np.ndarray[Any, Any], ds[()])


# The attribute types the format uses: integers, floats and strings (fixed or variable length).
_ATTRIBUTE_CLASSES = (h5py.h5t.INTEGER, h5py.h5t.FLOAT, h5py.h5t.STRING)


class ForeignAttribute:
    """Stands for an attribute whose stored type the format never uses (a variable-length
    sequence, a compound, a reference …): its value is not read, since HDF5 crashes on some
    damaged ones (a sequence where a string belongs). Compares equal to nothing the format wants."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"an attribute of HDF5 type {self.kind}"


def read_attribute(handle: Any, name: str) -> Any:
    """Attribute ``name`` of a file, group or dataset: None when absent, a :class:`ForeignAttribute`
    when its type is none of the format's (its data unread), else its value."""
    if name not in handle.attrs:
        return None
    stored = handle.attrs.get_id(name).get_type()
    kind = stored.get_class()
    if kind not in _ATTRIBUTE_CLASSES:
        return ForeignAttribute(_CLASS_NAMES.get(kind, f"class {kind}"))
    if kind == h5py.h5t.STRING and stored.is_variable_str():  # its text lives in a global heap
        check_global_heaps(handle.file, handle.file.filename)
    return handle.attrs[name]


_CLASS_NAMES = {getattr(h5py.h5t, n): n.lower() for n in
                ("TIME", "BITFIELD", "OPAQUE", "COMPOUND", "REFERENCE", "ENUM", "VLEN", "ARRAY")}


def format_version(handle: h5py.File) -> Any:
    return read_attribute(handle, FORMAT_VERSION_ATTR)


def check_format_version(handle: h5py.File, path: storage.AnyPath) -> None:
    """Raise :class:`VersionError` unless the root says ``format_version == 1``."""
    raise_first([checks_hdf5.format_version(str(path), format_version(handle))], VersionError)


def write_format_version(handle: h5py.File) -> None:
    handle.attrs[FORMAT_VERSION_ATTR] = np.int64(FORMAT_VERSION)


def link_name(name: str | bytes) -> str:
    """An HDF5 link or object name as text: h5py gives ``bytes`` for a name that is not UTF-8;
    its undecodable bytes become ``\\x..`` escapes (so it can match no name of the format).

    >>> link_name(b"transla\\xf4ion")
    'transla\\\\xf4ion'
    """
    return name if isinstance(name, str) else name.decode("utf-8", "backslashreplace")


def attr_str(handle: h5py.File, name: str) -> str | None:
    """Attribute ``name`` as text (None when absent or of a foreign type): bytes that are not UTF-8
    become U+FFFD, whether h5py gives them as ``bytes`` or as a ``str`` holding them as lone
    surrogates (``surrogateescape``, which no writer can encode again: found by the guided fuzzer)."""
    value = read_attribute(handle, name)
    if value is None or isinstance(value, ForeignAttribute):
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError:  # a surrogate that stands for no byte
            raw = text.encode("utf-8", errors="replace")
        return raw.decode("utf-8", errors="replace")
    return text


def attr_int(handle: h5py.File, name: str) -> int | None:
    value = read_attribute(handle, name)
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        return int(value)
    return None


def _chunk_offsets(ds: h5py.Dataset) -> dict[int, int] | None:
    """Where each chunk of a 1-d chunked dataset starts in its file (chunk number: byte offset), or
    None where the chunk index says something unusable (a damaged file), so that reads go through
    h5py and say what HDF5 says (an error, or the fill value for a chunk at address 0)."""
    found: list[tuple[Any, Any]] = []
    try:
        ds.id.chunk_iter(lambda info: found.append((info.chunk_offset, info.byte_offset)))
    except (OSError, RuntimeError, ValueError):
        return None
    chunk = ds.chunks[0]
    offsets: dict[int, int] = {}
    for position, byte_offset in found:
        if not position or position[0] is None or not byte_offset:  # HDF5 reads address 0 as the fill value
            return None
        offsets[int(position[0]) // chunk] = int(byte_offset)
    return offsets


class BlockReader:
    """Read element ranges of a 1-D dataset into caller buffers.

    Unfiltered, native-endian contiguous or chunked data is read straight from the
    file with ``os.preadv`` at the offsets HDF5 reports (no per-call HDF5 overhead,
    GIL released). Anything else (compression, checksums, external or virtual
    storage) goes through h5py.
    """

    def __init__(self, ds: h5py.Dataset, path: storage.AnyPath) -> None:
        self.ds = ds
        self.path = path
        self.itemsize = ds.dtype.itemsize
        self._chunk = 0
        self._offsets: dict[int, int] | None = None
        check_written(ds, path)
        plist = ds.id.get_create_plist()
        if storage.is_remote(path) or ds.file.driver == "fileobj":
            return  # no file descriptor: h5py reads through the ranged-read file object
        if ds.ndim != 1 or not ds.dtype.isnative or plist.get_nfilters() or plist.get_external_count():
            return
        layout = plist.get_layout()
        if layout == h5py.h5d.CONTIGUOUS:
            offset = ds.id.get_offset()
            if offset:  # None: never allocated; 0 (the superblock): HDF5 reads the fill value
                self._chunk, self._offsets = max(1, ds.shape[0]), {0: offset}
        elif layout == h5py.h5d.CHUNKED and ds.chunks is not None:
            self._offsets = _chunk_offsets(ds)
            self._chunk = ds.chunks[0] if self._offsets is not None else 0
        if self._offsets is not None:
            self._fd = os.open(path, os.O_RDONLY)
            self._file_size = os.fstat(self._fd).st_size

    @property
    def direct(self) -> bool:
        return self._offsets is not None

    def read(self, start: int, end: int, out: np.ndarray[Any, Any]) -> None:
        """Fill ``out`` (length ``end - start``) with elements ``[start, end)``."""
        if end <= start:
            return
        if self._offsets is None:
            self.ds.read_direct(out, np.s_[start:end], np.s_[0:end - start])
            return
        chunk, size = self._chunk, self.itemsize
        for k in range(start // chunk, (end - 1) // chunk + 1):
            lo, hi = max(start, k * chunk), min(end, (k + 1) * chunk)
            dest = out[lo - start:hi - start]
            base = self._offsets.get(k)
            if base is None:
                dest[...] = self.ds.fillvalue
                continue
            want = (hi - lo) * size
            position = base + (lo - k * chunk) * size
            if not 0 <= position <= self._file_size - want:  # a corrupt chunk address
                raise CorruptFileError(checks_hdf5.unreadable(
                    str(self.path), self.ds.name.lstrip("/"),
                    f"expected {want} bytes at offset {position}, beyond the file's {self._file_size} bytes"))
            got = os.preadv(self._fd, [cast(Any, dest)], position)
            if got != want:
                raise CorruptFileError(checks_hdf5.unreadable(
                    str(self.path), self.ds.name.lstrip("/"),
                    f"expected {want} bytes at offset {base}, found {got} (truncated file)"))

    def close(self) -> None:
        if self._offsets is not None:
            os.close(self._fd)
            self._offsets = None

    def __enter__(self) -> BlockReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ByteDatasetIO(io.RawIOBase):
    """A seekable binary file over a 1-D dataset of 1-byte elements (an opaque ``|V1`` blob).

    Reads go to HDF5 on demand, so a zip payload inside the blob can be inspected (its small
    directory and pickle) without reading the whole blob into memory.
    """

    def __init__(self, ds: h5py.Dataset) -> None:
        super().__init__()
        self.ds = ds
        self.size = int(ds.shape[0])
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self.size - self.pos))
        if n:
            view[:n] = self.ds[self.pos:self.pos + n].tobytes()
            self.pos += n
        return n


def byte_dataset_file(ds: h5py.Dataset) -> io.BufferedReader:
    """:class:`ByteDatasetIO` with a read buffer (zip and pickle readers make many small reads)."""
    return io.BufferedReader(ByteDatasetIO(ds), buffer_size=1 << 20)
