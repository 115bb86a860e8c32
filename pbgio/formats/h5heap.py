"""Global heap collections checked before HDF5 reads a variable-length string.

A variable-length string attribute (``config/json``, ``iteration/edge_path``) stores its text
in a *global heap collection* elsewhere in the file (HDF5 file format, "Global Heap"). HDF5
parses a collection without bounding its walk: a free-space object of size 0 makes it loop
forever, and objects that overrun the collection send it reading past its buffer. The fuzz
run found both (``tests/fuzz_known/``). :func:`check_global_heaps` walks every collection of a
local file the way HDF5 does, with the bounds, before the first such read, and raises
:class:`~pbgio.errors.CorruptFileError` for a damaged one.

Collections are found by their ``GCOL`` signature in the parts of the file that hold no
dataset's raw data (metadata is small, so the scan is cheap even for a file of gigabytes). A
match that does not look like a collection header (version 1, zero reserved bytes) is data,
not a collection, and is skipped: HDF5 refuses to load such a one itself.

>>> import tempfile, pathlib, h5py
>>> path = pathlib.Path(tempfile.mkdtemp()) / "x.h5"
>>> with h5py.File(path, "w") as f:
...     f.attrs["config/json"] = "{}"
>>> with h5py.File(path, "r") as f:
...     check_global_heaps(f, path)
>>> raw = bytearray(path.read_bytes())
>>> at = raw.find(b"GCOL") + 16                 # the first object's header
>>> raw[at:at + 16] = bytes(16)                  # index 0 (free space) of size 0
>>> _ = path.write_bytes(bytes(raw))
>>> with h5py.File(path, "r") as f:
...     try:
...         check_global_heaps(f, path)
...     except CorruptFileError as exc:
...         print(str(exc).split(": ", 1)[1].split(" at offset")[0])
expected a global heap collection whose objects fit in it, found an object of 0 bytes
"""

from __future__ import annotations

import os
from typing import Any

import h5py

from pbgio import storage
from pbgio.checks import hdf5 as checks_hdf5
from pbgio.errors import CorruptFileError

SIGNATURE = b"GCOL"
_SCAN_BLOCK = 1 << 20
_OBJECT_HEADER = 8  # index (2), reference count (2), reserved (4); then the size (lengths bytes)
_checked: set[tuple[int, int, int, int]] = set()  # device, inode, mtime, size of files found intact


def check_global_heaps(handle: h5py.File, path: storage.AnyPath) -> None:
    """Raise :class:`CorruptFileError` if a global heap collection of ``handle``'s file is damaged
    in a way that makes HDF5 loop or overrun. Only files HDF5 reads through its default POSIX
    driver are scanned (not those read through a file object: remote stores)."""
    if handle.driver != "sec2":
        return
    fd = int(handle.id.get_vfd_handle())  # HDF5's own descriptor: the file it has open, even if
    info = os.fstat(fd)                   # its name was removed or replaced meanwhile
    key = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
    if key in _checked:
        return
    lengths = _size_of_lengths(fd)
    for start, end in _metadata_ranges(handle, info.st_size):
        for at in _signatures(fd, start, end):
            _check_collection(fd, at, info.st_size, lengths, path)
    if len(_checked) > 4096:
        _checked.clear()
    _checked.add(key)


def _size_of_lengths(fd: int) -> int:
    """The superblock's "size of lengths" (8 in practice); superblock at 0, 512, 1024 … ."""
    base = 0
    while base < 1 << 20:
        head = os.pread(fd, 16, base)
        if head[:8] == b"\x89HDF\r\n\x1a\n":
            version = head[8]
            size = head[14] if version in (0, 1) else head[10]
            return size if size in (2, 4, 8) else 8
        base = 512 if base == 0 else base * 2
    return 8


def _metadata_ranges(handle: h5py.File, file_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of the file that hold no dataset's raw data."""
    extents: list[tuple[int, int]] = []

    def visit(_name: str, item: Any) -> None:
        if not isinstance(item, h5py.Dataset):
            return
        plist = item.id.get_create_plist()
        layout = plist.get_layout()
        if layout == h5py.h5d.CONTIGUOUS:
            offset = item.id.get_offset()
            if offset is not None:  # the bytes HDF5 reads for its elements, not the storage size the
                # layout claims: a damaged one (9.9 TB for 768 bytes) hid a collection from the scan
                nbytes = int(item.id.get_space().get_simple_extent_npoints()) * int(item.id.get_type().get_size())
                extents.append((offset, offset + min(int(item.id.get_storage_size()), nbytes)))
        elif layout == h5py.h5d.CHUNKED:
            item.id.chunk_iter(lambda c: extents.append((c.byte_offset, c.byte_offset + c.size)))

    handle.visititems(visit)
    ranges, position = [], 0
    for start, end in sorted(extents):
        if start > position:
            ranges.append((position, min(start, file_size)))
        position = max(position, end)
    if position < file_size:
        ranges.append((position, file_size))
    return ranges


def _signatures(fd: int, start: int, end: int) -> list[int]:
    found, at = [], start
    while at < end:
        block = os.pread(fd, min(_SCAN_BLOCK, end - at) + len(SIGNATURE) - 1, at)
        hit = block.find(SIGNATURE)
        while hit != -1 and at + hit < end:
            found.append(at + hit)
            hit = block.find(SIGNATURE, hit + 1)
        at += _SCAN_BLOCK
    return found


def _check_collection(fd: int, at: int, file_size: int, lengths: int, path: storage.AnyPath) -> None:
    header = os.pread(fd, 8 + lengths, at)
    if len(header) < 8 + lengths or header[4] != 1:  # HDF5 checks the version, not the 3 reserved bytes
        return  # not a collection header: data that happens to read "GCOL"
    size = int.from_bytes(header[8:8 + lengths], "little")
    if size < len(header) or at + size > file_size:
        raise _damaged(path, at, f"a collection of {size} bytes at offset {at} in a file of {file_size}")
    chunk = os.pread(fd, size, at)
    p, object_header = len(header), _OBJECT_HEADER + lengths
    while p < size:
        if p + object_header > size:
            return  # too small for an object header: free space, as HDF5 reads it
        index = int.from_bytes(chunk[p:p + 2], "little")
        object_size = int.from_bytes(chunk[p + 8:p + 8 + lengths], "little")
        need = object_header + -(-object_size // 8) * 8 if index > 0 else object_size
        if need <= 0 or need > size - p:
            what = "loop forever on it" if need <= 0 else "read past the collection"
            raise _damaged(path, at, f"an object of {object_size} bytes at offset {at + p} (HDF5 would {what})")
        p += need


def _damaged(path: storage.AnyPath, at: int, found: str) -> CorruptFileError:
    return CorruptFileError(checks_hdf5.unreadable(
        storage.display(path), None, f"expected a global heap collection whose objects fit in it, found {found}"))
