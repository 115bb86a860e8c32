"""The storages a pickled ``torch.save`` payload declares, read without importing or calling anything
it names, and bounded by what the file holds before ``torch.load`` sees the file.

``torch.load`` allocates each storage at the size its pickle declares: in the pre-1.6 container
while it unpickles, before it reads the storage's bytes; in the zip container at the declared
uncompressed size of the storage's member (bounded by :func:`pbgio.formats.torch_payload.torch_zip`).
So a few kilobytes that declare a 4 GiB storage take 4 GiB. :func:`storage_claims` reads the
declarations with an unpickler that builds nothing (every global becomes an inert stand-in);
:func:`check_zip_storages` and :func:`check_legacy_storages` refuse a declaration the file cannot
back. The legacy loader (:mod:`pbgio.legacy.pickles`) runs them on every file before ``torch.load``.

>>> import io, torch
>>> buffer = io.BytesIO()
>>> torch.save(torch.zeros(3), buffer, _use_new_zipfile_serialization=False)
>>> check_legacy_storages(buffer)
>>> huge = buffer.getvalue().replace(b"K\\x03", b"J\\x00\\x00\\x00\\x40", 1)  # 3 elements -> 2**30
>>> check_legacy_storages(io.BytesIO(huge))
Traceback (most recent call last):
...
pbgio.formats.torch_payload.PayloadError: the pickles declare 1 storage(s) of 4,294,967,304 bytes ...
"""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from pbgio.formats.torch_payload import BoundedReader, PayloadError, TorchZip, check_pickle_claims
from pbgio.spec.optimizer import STORAGE_DTYPES

STORAGE_ITEMSIZE: dict[str, int] = {
    **{name: np.dtype(np.uint16 if dtype == "bfloat16" else dtype).itemsize for name, dtype in STORAGE_DTYPES.items()},
    "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16, "UntypedStorage": 1, "QInt8Storage": 1,
    "QUInt8Storage": 1, "QInt32Storage": 4, "QUInt4x2Storage": 1, "QUInt2x4Storage": 1,
}
"""Bytes an element of each torch storage class takes (what torch allocates for a storage's count)."""


@dataclass(frozen=True)
class StorageClaim:
    """A storage a pickle declares: ``torch.{kind}`` of ``numel`` elements under ``key``."""

    key: str
    kind: str
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * STORAGE_ITEMSIZE[self.kind]


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


class _Inert:
    """What a pickle builds while its storage claims are read: accepts every call and builds nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        return super().__new__(cls)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Inert()

    __init__ = __setstate__ = __setitem__ = append = extend = add = _nothing


@dataclass(frozen=True)
class _StorageKind:
    name: str


class _ClaimsUnpickler(pickle.Unpickler):
    """Reads the storages a pickle declares; every global it names is an :class:`_Inert` stand-in (nothing is
    imported or called), every storage reference a :class:`StorageClaim`."""

    def __init__(self, file: IO[bytes], *, legacy: bool) -> None:
        super().__init__(file)
        self.legacy = legacy
        self.claims: dict[str, StorageClaim] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name.endswith("Storage"):
            return _StorageKind(name)
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0] if isinstance(pid, tuple) and pid else None
        kind = kind.decode("ascii", "replace") if isinstance(kind, bytes) else kind
        if self.legacy and kind == "module":
            return _Inert()
        fields = 6 if self.legacy else 5
        if not (kind == "storage" and len(pid) == fields and isinstance(pid[1], _StorageKind)
                and isinstance(pid[2], str | bytes) and isinstance(pid[4], int) and pid[4] >= 0):
            raise PayloadError(f"expected a storage reference ('storage', type, key, location, size), "
                               f"found {str(pid)[:80]}")
        if pid[1].name not in STORAGE_ITEMSIZE:
            raise PayloadError(f"the pickle declares a storage of the unknown type torch.{pid[1].name}")
        key = pid[2].decode("utf-8", "replace") if isinstance(pid[2], bytes) else pid[2]
        claim = StorageClaim(key, pid[1].name, pid[4])
        known = self.claims.setdefault(key, claim)
        if known.nbytes != claim.nbytes:
            raise PayloadError(f"storage {key!r} is declared twice, with {known.nbytes:,} and {claim.nbytes:,} bytes")
        return _Inert()


def storage_claims(stream: IO[bytes], *, legacy: bool, walked: bool = False) -> dict[str, StorageClaim]:
    """The storages the pickle at the stream position declares, by key, read without importing or calling
    anything it names, after :func:`check_pickle_claims` (``walked``: the caller's own walk of this pickle
    bounded the same claims already); the stream is left after the pickle. ``legacy``: the pre-1.6
    container's storage references (six fields, not five)."""
    if not walked:
        check_pickle_claims(stream)
    unpickler = _ClaimsUnpickler(stream, legacy=legacy)
    try:
        unpickler.load()
    except PayloadError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            struct.error, RecursionError, OverflowError, UnicodeDecodeError) as exc:
        raise PayloadError(f"the pickle is unreadable ({type(exc).__name__}: {str(exc)[:120]})") from None
    return unpickler.claims


def check_zip_storages(container: TorchZip, claims: dict[str, StorageClaim]) -> None:
    """Raise :class:`PayloadError` unless each storage ``claims`` names has its member ``data/{key}``
    holding exactly its bytes (torch wraps the member's bytes as the storage: a larger claim would
    read past them)."""
    for key, claim in claims.items():
        info = container.record(f"data/{key}")
        if info is None:
            raise PayloadError(f"storage {key!r} has no member {container.prefix}/data/{key}")
        if info.file_size != claim.nbytes:
            raise PayloadError(f"storage {key!r} claims {claim.numel:,} elements of torch.{claim.kind} "
                               f"({claim.nbytes:,} bytes), its member {info.filename} holds {info.file_size:,}")


def check_legacy_storages(source: IO[bytes], *, walked: bool = False) -> None:
    """Raise :class:`PayloadError` unless the storages the pre-1.6 container in ``source`` declares fit in
    the bytes after its pickles (torch allocates each storage at its declared size while it unpickles,
    before it reads the storage's bytes); every pickle's own claims are bounded too, unless ``walked``
    (the caller's walk of the five pickles bounded them: see :func:`storage_claims`)."""
    stream: Any = BoundedReader(source)
    stream.seek(0)
    claims: dict[str, StorageClaim] = {}
    for index in range(5):  # magic, protocol, sys_info, the object, storage keys
        if index == 3:
            claims = storage_claims(stream, legacy=True, walked=walked)
            continue
        if not walked:
            check_pickle_claims(stream)
        try:
            for _ in pickletools.genops(stream):
                pass
        except (ValueError, EOFError, struct.error, OverflowError, UnicodeDecodeError) as exc:
            raise PayloadError(f"the pickle is unreadable ({type(exc).__name__}: {str(exc)[:120]})") from None
    start = stream.tell()
    left = stream.seek(0, io.SEEK_END) - start
    needed = sum(8 + claim.nbytes for claim in claims.values())  # each storage: its count, then its bytes
    if needed > left:
        biggest = max(claims.values(), key=lambda c: c.nbytes)
        raise PayloadError(f"the pickles declare {len(claims)} storage(s) of {needed:,} bytes (storage "
                           f"{biggest.key!r}: {biggest.numel:,} elements of torch.{biggest.kind}), the "
                           f"{left:,} bytes after them cannot hold them")
