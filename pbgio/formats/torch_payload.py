"""Read ``torch.save`` payloads without torch and without running pickled code.

A payload is a pickle whose tensors point into raw storages: the zip container of torch ≥ 1.6
(``*/data.pkl`` plus one ``*/data/{key}`` member per storage) or the legacy container before
it (five pickles, then the storages back to back). :func:`read_payload` unpickles the object
with an unpickler that knows only :data:`pbgio.spec.optimizer.PAYLOAD_GLOBALS` (anything else
is a :class:`PayloadError` naming the global: nothing a payload names is imported or called)
and returns it with :class:`TensorRef` leaves in place of tensors. A leaf's data is read only on
request (:meth:`TorchPayload.array`, :meth:`TorchPayload.blocks`), after its size is checked
against the bytes actually present, so a payload that claims a huge tensor allocates nothing.

>>> import io, torch
>>> buffer = io.BytesIO()
>>> torch.save({"sum": torch.tensor([0.5, 2.0])}, buffer)
>>> payload = read_payload(buffer.getvalue())
>>> ref = payload.value["sum"]
>>> ref.dtype, ref.shape, payload.array(ref).tolist()
('float32', (2,), [0.5, 2.0])

The members of a zip container are read as torch's own reader finds them (:func:`torch_zip`), so
that pbgio and ``torch.load`` see the same records; :mod:`pbgio.formats.torch_claims` bounds the
storages a pickle declares before the legacy loader hands a file to ``torch.load``.
"""

from __future__ import annotations

import io
import lzma
import pickle
import pickletools
import struct
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal

import numpy as np
from numpy.typing import NDArray

from pbgio.spec.checkpoint import TORCH_LEGACY_MAGIC, TORCH_ZIP_MAGIC
from pbgio.spec.optimizer import (
    ORDERED_DICT,
    PAYLOAD_GLOBALS,
    REBUILD_TENSOR,
    STORAGE_DTYPES,
    StorageRef,
    TensorRef,
)

Container = Literal["zip", "legacy"]
LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL_VERSION = 1001
DEFAULT_BLOCK_ELEMENTS = 1 << 22
# What zipfile raises for a damaged archive: bad offsets (ValueError, a negative seek), a
# compression method it lacks (NotImplementedError), encryption (RuntimeError), bad data.
_ZIP_ERRORS = (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError, OverflowError,
               struct.error, zlib.error, lzma.LZMAError, UnicodeDecodeError)


class BoundedReader:
    """A read-only view of a seekable binary file whose reads never ask for more than remains.

    ``BufferedReader.read(n)`` allocates ``n`` bytes before reading, so a pickle opcode claiming
    a 4 GB string would allocate 4 GB; through this view it reads what the file holds.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        here = raw.tell()
        self.size = raw.seek(0, io.SEEK_END)
        raw.seek(here)

    def read(self, n: int | None = -1) -> bytes:
        left = max(0, self.size - self.raw.tell())
        return self.raw.read(left if n is None or n < 0 else min(n, left))

    def readline(self, limit: int = -1) -> bytes:
        return self.raw.readline(limit)

    def tell(self) -> int:
        return self.raw.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.raw.seek(offset, whence)


class PayloadError(ValueError):
    """The bytes are no readable ``torch.save`` payload, or name something not allowed."""


@dataclass
class TorchPayload:
    """The unpickled object (:class:`TensorRef` leaves) and access to its storages' bytes."""

    value: Any
    container: Container
    _source: IO[bytes]
    _locations: dict[str, tuple[str | int, np.dtype[Any]]]
    _zip: zipfile.ZipFile | None = None

    def array(self, ref: TensorRef) -> NDArray[Any]:
        """The tensor's values as a new numpy array (bfloat16 is widened to float32)."""
        if not ref.is_contiguous():
            storage = np.concatenate(list(self._storage_blocks(ref.storage, 0, ref.storage.numel)))  # numel > 0
            view = np.lib.stride_tricks.as_strided(
                storage[ref.offset:], shape=ref.shape,
                strides=tuple(s * storage.itemsize for s in ref.stride), writeable=False)
            return np.array(view)
        parts = list(self._storage_blocks(ref.storage, ref.offset, ref.numel))
        flat = np.concatenate(parts) if parts else np.zeros(0, self._dtype(ref.storage))
        return flat.reshape(ref.shape)

    def blocks(self, ref: TensorRef, block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> Iterator[NDArray[Any]]:
        """The values of a contiguous tensor in flat blocks (memory bounded by a block)."""
        if not ref.is_contiguous():
            yield self.array(ref).reshape(-1)
            return
        yield from self._storage_blocks(ref.storage, ref.offset, ref.numel, block_elements)

    def _dtype(self, storage: StorageRef) -> np.dtype[Any]:
        return self._locations[storage.key][1]

    def _storage_blocks(self, storage: StorageRef, start: int, count: int,
                        block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> Iterator[NDArray[Any]]:
        where, dtype = self._locations[storage.key]
        itemsize = dtype.itemsize
        try:
            if self._zip is not None:
                stream: IO[bytes] = self._zip.open(str(where))
            else:
                stream = self._source
                stream.seek(int(where))
        except _ZIP_ERRORS as exc:
            raise PayloadError(f"storage {storage.key!r} is unreadable ({exc})") from None
        try:
            _skip(stream, start * itemsize)
            remaining = count
            while remaining > 0:
                n = min(remaining, block_elements)
                try:
                    raw = stream.read(n * itemsize)
                except _ZIP_ERRORS as exc:
                    raise PayloadError(f"storage {storage.key!r} is unreadable ({exc})") from None
                if len(raw) != n * itemsize:
                    raise PayloadError(f"storage {storage.key!r} ends early")
                yield _widen(np.frombuffer(raw, dtype=dtype).copy(), storage.dtype)
                remaining -= n
        finally:
            if self._zip is not None:
                stream.close()


def _skip(stream: IO[bytes], nbytes: int) -> None:
    while nbytes > 0:
        try:
            got = len(stream.read(min(nbytes, 1 << 20)))
        except _ZIP_ERRORS as exc:
            raise PayloadError(f"a storage is unreadable ({exc})") from None
        if got == 0:
            raise PayloadError("a storage ends early")
        nbytes -= got


def _widen(values: NDArray[Any], dtype: str) -> NDArray[Any]:
    if dtype == "bfloat16":  # stored as the high 16 bits of a float32
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values


def _numpy_dtype(name: str, little_endian: bool) -> np.dtype[Any]:
    base = np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)
    return base.newbyteorder("<" if little_endian else ">") if base.itemsize > 1 else base


# --------------------------------------------------------------------------- unpickling


@dataclass(frozen=True)
class _StorageType:
    dtype: str


def _rebuild_tensor(storage: Any, offset: Any, shape: Any, stride: Any, *_rest: Any) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise PayloadError("a tensor refers to something that is not a storage")
    if not (isinstance(offset, int) and isinstance(shape, tuple) and isinstance(stride, tuple)
            and len(shape) == len(stride) and all(isinstance(v, int) and v >= 0 for v in (*shape, *stride))
            and offset >= 0):
        raise PayloadError(f"a tensor has a malformed offset/shape/stride {offset!r}, {shape!r}, {stride!r}")
    ref = TensorRef(storage, offset, tuple(shape), tuple(stride))
    if ref.extent() > storage.numel:
        raise PayloadError(f"a tensor of shape {ref.shape} reaches past the {storage.numel} elements of "
                           f"storage {storage.key!r}")
    return ref


class _RestrictedUnpickler(pickle.Unpickler):
    """Knows only the allowed globals; storages become :class:`StorageRef` objects."""

    def __init__(self, file: IO[bytes], *, legacy: bool) -> None:
        super().__init__(file)
        self.legacy = legacy
        self.storages: dict[str, StorageRef] = {}

    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        if qualified not in PAYLOAD_GLOBALS:
            raise PayloadError(f"the payload names the global {qualified}, which is not allowed "
                               f"(allowed: {', '.join(sorted(PAYLOAD_GLOBALS))})")
        if qualified == ORDERED_DICT:
            return OrderedDict
        if qualified == REBUILD_TENSOR:
            return _rebuild_tensor
        return _StorageType(STORAGE_DTYPES[name])

    def persistent_load(self, pid: Any) -> Any:
        fields = 6 if self.legacy else 5
        if not (isinstance(pid, tuple) and len(pid) == fields and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str) and isinstance(pid[4], int)
                and pid[4] >= 0):
            raise PayloadError(f"expected a storage reference ('storage', type, key, location, size), "
                               f"found {str(pid)[:80]}")
        if self.legacy and pid[5] is not None:
            raise PayloadError("the payload holds a view of another storage, which optimizer states never do")
        ref = StorageRef(pid[2], pid[1].dtype, pid[4])
        known = self.storages.setdefault(ref.key, ref)
        if known != ref:
            raise PayloadError(f"storage {ref.key!r} is declared twice with different types or sizes")
        return known


MEMO_SLACK = 1 << 16
"""How far past the memo slots it has filled a pickle may put one (picklers number them 0, 1, 2 …)."""


def check_pickle_claims(stream: IO[bytes]) -> None:
    """Walk the pickle at the stream position, opcode by opcode, and go back there; raise
    :class:`PayloadError` for a claim the unpickler would allocate before reading it.

    CPython's unpickler allocates what a pickle claims before reading it: its memo grows to the
    slot a ``PUT`` names (8 bytes a slot: ``LONG_BINPUT 1141532771`` in a 200-byte payload made it
    take 18 GB), a ``FRAME`` is allocated at its claimed length, and so is a counted string or
    bytes (``BINBYTES8``, ``BINUNICODE8`` …). The walk reads each counted argument as far as the
    stream holds it (refusing one that claims more), refuses a frame longer than the bytes left,
    and a memo slot far past those filled."""
    start = stream.tell()
    end = stream.seek(0, io.SEEK_END)
    stream.seek(start)
    filled = 0
    try:
        for opcode, arg, pos in pickletools.genops(stream):
            if opcode.name == "FRAME" and isinstance(arg, int) and arg > end - stream.tell():
                raise PayloadError(f"the pickle's FRAME at byte {pos} claims {arg:,} bytes, "
                                   f"{end - stream.tell():,} are left")
            if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                slot = arg if isinstance(arg, int) else -1
                if not 0 <= slot <= filled + MEMO_SLACK:
                    raise PayloadError(f"the pickle's {opcode.name} at byte {pos} puts memo slot {slot:,} after "
                                       f"{filled:,} were filled (a pickler numbers them 0, 1, 2 …; reading it "
                                       f"would allocate at least {8 * (slot + 1):,} bytes)")
                filled += 1
            elif opcode.name == "MEMOIZE":
                filled += 1
    except (ValueError, EOFError, struct.error, OverflowError, UnicodeDecodeError) as exc:
        if isinstance(exc, PayloadError):
            raise
        raise PayloadError(f"the pickle is unreadable ({type(exc).__name__}: {str(exc)[:120]})") from None
    stream.seek(start)


def _unpickle(stream: IO[bytes], *, legacy: bool) -> tuple[Any, dict[str, StorageRef]]:
    check_pickle_claims(stream)
    unpickler = _RestrictedUnpickler(stream, legacy=legacy)
    try:
        value = unpickler.load()
    except PayloadError:
        raise
    # No MemoryError here: after check_pickle_claims nothing a payload claims is allocated, and one that is
    # must stay visible (the fuzz harness bounds memory and reports it).
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            struct.error, RecursionError, OverflowError) as exc:
        raise PayloadError(f"the pickle is unreadable ({type(exc).__name__}: {str(exc)[:120]})") from None
    return value, unpickler.storages


# --------------------------------------------------------------------------- containers


def read_payload(source: bytes | IO[bytes]) -> TorchPayload:
    """Unpickle a ``torch.save`` payload (zip or legacy container); see the module doc.

    ``source`` is the bytes, or a seekable binary file positioned anywhere (for large blobs,
    e.g. a view of an HDF5 dataset, so that only the small pickle is read up front).
    """
    stream = io.BytesIO(source) if isinstance(source, bytes | bytearray) else source
    stream.seek(0)
    head = stream.read(len(TORCH_LEGACY_MAGIC))
    stream.seek(0)
    if head.startswith(TORCH_ZIP_MAGIC):
        return _read_zip(stream)
    if head == TORCH_LEGACY_MAGIC:
        return _read_legacy(stream)
    raise PayloadError(f"expected a torch.save payload (zip or legacy container), found bytes {head[:8]!r}")


def _read_zip(stream: IO[bytes]) -> TorchPayload:
    container = torch_zip(stream)
    archive = container.archive
    pickled = container.record("data.pkl")
    if pickled is None:
        raise PayloadError(f"expected {container.prefix}/data.pkl in the zip container, found none")
    try:
        with archive.open(pickled) as member:
            value, storages = _unpickle(member, legacy=False)
        order = container.record("byteorder")
        little = archive.read(order).decode("ascii", "replace") != "big" if order is not None else True
    except PayloadError:
        raise
    except _ZIP_ERRORS as exc:
        raise PayloadError(f"the zip container is unreadable ({exc})") from None
    locations: dict[str, tuple[str | int, np.dtype[Any]]] = {}
    for key, ref in storages.items():
        dtype = _numpy_dtype(ref.dtype, little)
        info = container.record(f"data/{key}")
        if info is None:
            raise PayloadError(f"storage {key!r} has no member {container.prefix}/data/{key} in the zip container")
        if info.file_size != ref.numel * dtype.itemsize:
            raise PayloadError(f"storage {key!r} claims {ref.numel} {ref.dtype} elements "
                               f"({ref.numel * dtype.itemsize} bytes), its member holds {info.file_size}")
        locations[key] = (info.filename, dtype)
    return TorchPayload(value, "zip", stream, locations, archive)


def _read_legacy(source: IO[bytes]) -> TorchPayload:
    stream: Any = BoundedReader(source)
    magic, _ = _unpickle(stream, legacy=True)
    protocol, _ = _unpickle(stream, legacy=True)
    sys_info, _ = _unpickle(stream, legacy=True)
    if magic != LEGACY_MAGIC_NUMBER or protocol != LEGACY_PROTOCOL_VERSION or not isinstance(sys_info, dict):
        raise PayloadError(f"expected the legacy container's header, found {magic!r}, {protocol!r}")
    little = bool(sys_info.get("little_endian", True))
    value, storages = _unpickle(stream, legacy=True)
    keys, _ = _unpickle(stream, legacy=True)
    if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)) or set(keys) != set(storages):
        raise PayloadError("the legacy container's storage list does not match its tensors")
    locations: dict[str, tuple[str | int, np.dtype[Any]]] = {}
    for key in keys:
        ref = storages[key]
        dtype = _numpy_dtype(ref.dtype, little)
        header = stream.read(8)
        if len(header) != 8:
            raise PayloadError(f"storage {key!r} is missing: the payload ends early")
        (numel,) = struct.unpack("<q" if little else ">q", header)
        if numel != ref.numel:
            raise PayloadError(f"storage {key!r} claims {ref.numel} elements, its data says {numel}")
        start = stream.tell()
        end = stream.seek(0, io.SEEK_END)
        if end - start < numel * dtype.itemsize:
            raise PayloadError(f"storage {key!r} needs {numel * dtype.itemsize} bytes, {end - start} remain")
        locations[key] = (start, dtype)
        stream.seek(start + numel * dtype.itemsize)
    return TorchPayload(value, "legacy", stream, locations)


# --------------------------------------------------------------------------- what torch's reader reads

DEFLATE_MAX_RATIO = 1032
"""Bytes a deflate stream gives back per byte, at most (a 258-byte match costs at least two bits)."""
_STORED, _DEFLATED = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED
_ENCRYPTED = 0x1
_UTF8_NAME = 0x800


@dataclass(frozen=True)
class TorchZip:
    """A ``torch.save`` zip container as torch's reader (miniz, in ``PyTorchStreamReader``) sees it.

    torch names the records it reads (``data.pkl``, ``byteorder``, ``data/{key}``, ``version`` …)
    relative to the folder of the archive's first member, and finds each one by
    ``mz_zip_reader_locate_file`` without ``MZ_ZIP_FLAG_CASE_SENSITIVE``: its name is matched
    ASCII-case-insensitively. Python's :mod:`zipfile` matches names exactly, so a reader that looks
    members up there may read another member than torch loads (``archive/data.pkl`` beside
    ``archive/DATA.PKL``). :func:`torch_zip` refuses every archive where the two could differ;
    :meth:`record` then names the one member torch reads.
    """

    archive: zipfile.ZipFile
    prefix: str
    records: dict[bytes, zipfile.ZipInfo]

    def record(self, name: str) -> zipfile.ZipInfo | None:
        """The member torch reads for the record ``name`` (``data.pkl``, ``data/0``), or None."""
        return self.records.get(name.encode("utf-8").lower())


def _raw_name(info: zipfile.ZipInfo) -> bytes:
    """A member's name as the archive stores it (miniz compares these bytes)."""
    return info.orig_filename.encode("utf-8" if info.flag_bits & _UTF8_NAME else "cp437")


def torch_zip(stream: IO[bytes]) -> TorchZip:
    """The zip container in ``stream`` with its members as torch's reader finds them, every one bounded
    by what the file can hold; :class:`PayloadError` for an archive torch and :mod:`zipfile` could read
    differently or that claims more than it holds:

    - the central directory lies where the end record says (no data before the archive, which
      zipfile skips and miniz does not); every name is stored whole (no NUL) under the folder of the
      first member, as torch requires; no two names are one name to torch (ASCII case folded);
    - each member is stored or deflated, not encrypted (what miniz reads), within the file, and
      declares at most the file's size uncompressed, and at most :data:`DEFLATE_MAX_RATIO` bytes a
      deflated byte: torch allocates a record's declared size before it inflates it.
    """
    size = stream.seek(0, io.SEEK_END)
    stream.seek(0)
    try:
        archive = zipfile.ZipFile(stream)
        infos = archive.infolist()
        end_record = getattr(zipfile, "_EndRecData", None)
        declared = end_record(stream) if end_record is not None else None
    except _ZIP_ERRORS as exc:
        raise PayloadError(f"the zip container is unreadable ({exc})") from None
    if declared is not None and archive.start_dir != declared[6]:  # _ECD_OFFSET
        raise PayloadError(f"expected the zip's central directory at byte {declared[6]:,}, as its end record "
                           f"says, found it at {archive.start_dir:,} (bytes before the archive, which torch's "
                           "reader does not skip)")
    if not infos:
        raise PayloadError("expected a zip container with members, found none")
    first = _raw_name(infos[0])
    if b"/" not in first:
        raise PayloadError(f"expected the first member in a folder (torch reads the folder's records), found "
                           f"{infos[0].filename!r}")
    prefix = first.split(b"/", 1)[0] + b"/"
    records: dict[bytes, zipfile.ZipInfo] = {}
    for info in infos:
        _check_member(info, prefix, size)
        key = _raw_name(info)[len(prefix):].lower()
        other = records.setdefault(key, info)
        if other is not info:
            raise PayloadError(f"the members {other.filename!r} and {info.filename!r} are one record to torch's "
                               "reader, which matches names ignoring ASCII case: which of them torch loads "
                               "depends on the archive's order")
    return TorchZip(archive, prefix[:-1].decode("utf-8", "replace"), records)


def _check_member(info: zipfile.ZipInfo, prefix: bytes, size: int) -> None:
    name = info.filename
    if info.orig_filename != name:
        raise PayloadError(f"the member {info.orig_filename!r} has a name zipfile cuts short (a NUL in it)")
    if not _raw_name(info).startswith(prefix):
        raise PayloadError(f"expected every member under {prefix.decode('utf-8', 'replace')} like the first, "
                           f"found {name!r}")
    if info.flag_bits & _ENCRYPTED or info.compress_type not in (_STORED, _DEFLATED):
        raise PayloadError(f"the member {name!r} is encrypted or compressed with method {info.compress_type}; "
                           "torch's reader reads stored and deflated members only")
    if info.header_offset + info.compress_size > size:
        raise PayloadError(f"the member {name!r} claims {info.compress_size:,} bytes from byte "
                           f"{info.header_offset:,}, past the end of the file's {size:,} bytes")
    if info.file_size > size:
        raise PayloadError(f"the member {name!r} declares {info.file_size:,} bytes uncompressed, more than the "
                           f"file's {size:,} bytes (torch allocates a record whole before inflating it)")
    bound = info.compress_size * (DEFLATE_MAX_RATIO if info.compress_type == _DEFLATED else 1)
    if info.file_size > bound:
        raise PayloadError(f"the member {name!r} declares {info.file_size:,} bytes uncompressed from "
                           f"{info.compress_size:,} stored bytes, more than they can hold (at most {bound:,})")
