"""Hostile files for the attack corpus (:mod:`pbgio.testing.attacks`), written as an attacker would.

Each writer takes a genuine file of a layout and turns it into what an attacker ships: an HDF5
dataset that is an external link, external raw storage, a virtual dataset or a run of unwritten
chunks; a bucket whose one gzip chunk inflates to gigabytes; a torch zip whose storage inflates to
gigabytes, or that holds a second pickle torch loads instead of the one a scan reads; a FAISS index
whose header claims gigabytes it does not hold. The large ones are built without ever holding their
inflated size: deflate blocks of zeros are repeated (a full flush leaves no back-reference across
blocks, so a block of a fresh compressor is valid at any place in the stream).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np

BLOCK = 1 << 20
"""Bytes of zeros one repeated deflate block inflates to."""


def _zero_block() -> bytes:
    """One raw deflate block (no header) of :data:`BLOCK` zeros, ending on a full flush."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(bytes(BLOCK)) + compressor.flush(zlib.Z_FULL_FLUSH)


def _final_block() -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.flush(zlib.Z_FINISH)


def zlib_zeros(size: int) -> bytes:
    """A zlib stream (what HDF5's gzip filter stores) that inflates to ``size`` zero bytes (a
    multiple of :data:`BLOCK`), about ``size / 1000`` bytes long.

    >>> zlib.decompress(zlib_zeros(2 * BLOCK)) == bytes(2 * BLOCK)
    True
    """
    assert size % BLOCK == 0
    adler = ((size % 65521) << 16) | 1  # the sum of zeros stays 1; the sum of sums grows by 1 a byte
    return b"\x78\xda" + _zero_block() * (size // BLOCK) + _final_block() + struct.pack(">I", adler)


# --------------------------------------------------------------------------- HDF5


def replace_dataset(path: Path, name: str, make: Any) -> None:
    """Delete dataset ``name`` of the HDF5 file ``path`` and put ``make(file)``'s result in its place
    (``make`` may also create the dataset itself and return None)."""
    with h5py.File(path, "a") as f:
        del f[name]
        made = make(f)
        if made is not None:
            f[name] = made


def external_link(path: Path, name: str, target: Path, target_name: str) -> None:
    """Dataset ``name`` becomes an HDF5 external link to ``target_name`` in the file ``target``."""
    replace_dataset(path, name, lambda f: h5py.ExternalLink(str(target), target_name))


def external_storage(path: Path, name: str, target: Path, rows: int) -> None:
    """Dataset ``name`` becomes ``rows`` int64 rows whose bytes are those of the file ``target``
    (HDF5 external raw storage: the library reads ``target`` when the dataset is read)."""
    def make(f: Any) -> None:
        f.create_dataset(name, shape=(rows,), dtype="<i8", external=[(str(target), 0, rows * 8)])

    replace_dataset(path, name, make)


def virtual_dataset(path: Path, name: str, target: Path, target_name: str, rows: int) -> None:
    """Dataset ``name`` becomes a virtual dataset mapping ``rows`` rows of ``target_name`` in
    ``target``."""
    def make(f: Any) -> None:
        layout = h5py.VirtualLayout(shape=(rows,), dtype="<i8")
        layout[:] = h5py.VirtualSource(str(target), target_name, shape=(rows,))
        f.create_virtual_dataset(name, layout)

    replace_dataset(path, name, make)


def unwritten_rows(path: Path, names: tuple[str, ...], rows: int) -> None:
    """Datasets ``names`` become ``rows`` int64 rows each in chunks never written (a few hundred
    bytes on disk; reading them gives the fill value, zero, ``rows`` times)."""
    with h5py.File(path, "a") as f:
        for name in names:
            del f[name]
            f.create_dataset(name, shape=(rows,), dtype="<i8", chunks=(1 << 16,), maxshape=(None,))


def gzip_bomb_bucket(path: Path, rows: int) -> None:
    """An edge bucket of ``rows`` edges (all zero) whose ``lhs``, ``rhs`` and ``rel`` are each one
    gzip chunk of ``rows * 8`` bytes: a few megabytes on disk; a reader that inflates the chunk
    for every slice it reads inflates it ``rows * 8 / slice`` times."""
    chunk = zlib_zeros(rows * 8)
    with h5py.File(path, "w") as f:
        f.attrs["format_version"] = np.int64(1)
        for name in ("lhs", "rhs", "rel"):
            ds = f.create_dataset(name, shape=(rows,), dtype="<i8", chunks=(rows,), compression="gzip")
            ds.id.write_direct_chunk((0,), chunk)


# --------------------------------------------------------------------------- torch zips


def _members(path: Path) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(path) as archive:
        return [(info, archive.read(info)) for info in archive.infolist()]


def case_decoy(path: Path, loaded_pickle: bytes) -> None:
    """Rewrite the torch zip ``path``: its ``archive/data.pkl`` becomes ``archive/DATA.PKL`` holding
    ``loaded_pickle`` (torch's reader finds it by a case-insensitive match and loads it), and the
    genuine pickle moves to ``archive/decoy/data.pkl`` (a scan that looks for a member named
    ``…/data.pkl`` reads that one)."""
    members = _members(path)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for info, data in members:
            if info.filename.endswith("/data.pkl"):
                prefix = info.filename[: -len("data.pkl")]
                out.writestr(prefix + "DATA.PKL", loaded_pickle)
                out.writestr(prefix + "decoy/data.pkl", data)
            else:
                out.writestr(info.filename, data)


class _RepeatedZeros:
    """A stand-in for zipfile's deflate compressor fed only :data:`BLOCK`-sized runs of zeros."""

    def __init__(self) -> None:
        self.block = _zero_block()

    def compress(self, data: bytes) -> bytes:
        assert len(data) == BLOCK
        return self.block

    def flush(self) -> bytes:
        return _final_block()


def inflated_storage(path: Path, storage: str, size: int) -> None:
    """Rewrite the torch zip ``path`` so that its storage member ``storage`` (``data/0``) is ``size``
    zero bytes (a multiple of :data:`BLOCK`), deflated to about ``size / 1000`` bytes; the pickle is
    rewritten to claim as many elements (float32) for that storage, in one row of that length."""
    members = _members(path)
    elements = size // 4
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for info, data in members:
            if info.filename.endswith("/data.pkl"):
                out.writestr(info.filename, rewrite_pickle(data, storage, elements=elements))
            elif info.filename.endswith("/" + storage):
                entry = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                entry.compress_type = zipfile.ZIP_DEFLATED
                with out.open(entry, "w", force_zip64=True) as sink:
                    sink._compressor = _RepeatedZeros()  # type: ignore[attr-defined]
                    zeros = bytes(BLOCK)
                    for _ in range(size // BLOCK):
                        sink.write(zeros)
            else:
                out.writestr(info, data)


STORAGE_ITEMSIZE = {"HalfStorage": 2, "BFloat16Storage": 2, "FloatStorage": 4, "IntStorage": 4, "DoubleStorage": 8,
                    "LongStorage": 8, "ShortStorage": 2, "ByteStorage": 1, "CharStorage": 1, "BoolStorage": 1}


def rewrite_pickle(pickled: bytes, storage: str, *, elements: int | None = None,
                   storage_type: str | None = None) -> bytes:
    """``pickled`` (a torch ``data.pkl``) re-pickled with the storage whose key is ``storage``'s last
    part changed: claiming ``elements`` elements (its tensor then one row of that length), or of the
    torch type ``storage_type`` (``HalfStorage``: the same bytes, a float32 storage's, counted as that
    type's elements). Nothing is loaded: storages stay persistent ids."""
    import io
    import pickle

    import torch

    key = storage.rsplit("/", 1)[-1]

    class Keep:
        def __init__(self, pid: Any) -> None:
            self.pid = pid

    class Rebuilt:
        def __init__(self, function: Any, args: tuple[Any, ...]) -> None:
            self.function, self.args = function, args

        def __reduce__(self) -> Any:
            return (self.function, self.args)

    class Reader(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            return Keep(pid)

        def find_class(self, module: str, name: str) -> Any:
            if module == "torch._utils" and name.startswith("_rebuild_"):
                function = getattr(torch._utils, name)
                return lambda *args: Rebuilt(function, args)
            return super().find_class(module, name)

    def rebuild(node: Any) -> Any:
        if isinstance(node, Rebuilt):
            args = tuple(rebuild(a) for a in node.args)
            store = args[0] if args else None
            if isinstance(store, Keep) and store.pid[2] == key:
                pid = list(store.pid)
                if storage_type is not None:  # the same bytes (a float32 storage's), counted in the new type
                    pid[1] = getattr(torch, storage_type)
                    pid[4] = pid[4] * 4 // STORAGE_ITEMSIZE[storage_type]
                if elements is not None:
                    pid[4] = elements
                    args = (store, 0, (elements,), (1,), *args[4:])
                store.pid = tuple(pid)
            return Rebuilt(node.function, args)
        if isinstance(node, tuple):
            return tuple(rebuild(a) for a in node)
        if isinstance(node, list):
            return [rebuild(a) for a in node]
        if isinstance(node, dict):
            return type(node)((k, rebuild(v)) for k, v in node.items())
        return node

    class Writer(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return obj.pid if isinstance(obj, Keep) else None

    out = io.BytesIO()
    Writer(out, protocol=2).dump(rebuild(Reader(io.BytesIO(pickled)).load()))
    return out.getvalue()


def read_member(path: Path, suffix: str) -> bytes:
    """The member of the zip ``path`` whose name ends with ``suffix``."""
    with zipfile.ZipFile(path) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(suffix)]
        return archive.read(name)


# --------------------------------------------------------------------------- FAISS


def faiss_claim(path: Path, claimed_floats: int, *, payload_bytes: int = 4096) -> None:
    """Rewrite the index file ``path`` (a flat FAISS index, as ``pbgio index build`` writes it): its
    payload's header claims ``claimed_floats`` codes (and as many rows as that makes), the payload is
    cut or padded to ``payload_bytes`` and stored in chunks (so it is streamed, not mapped), and the
    recorded digest is the new payload's: intact by every check a reader makes before loading it."""
    from pbgio.spec.index import META_ATTR, PAYLOAD_DATASET

    with h5py.File(path, "r") as f:
        attrs = {k: f.attrs[k] for k in f.attrs}
        payload = bytearray(np.asarray(f[PAYLOAD_DATASET]).tobytes())
    if payload[:3] != b"IxF":
        raise ValueError(f"{path}: not a flat FAISS index ({bytes(payload[:4])!r})")
    # fourcc, d (int32), ntotal (int64), two int64, is_trained (byte), metric (int32) [, its float arg]
    dimension = struct.unpack_from("<i", payload, 4)[0]
    metric = struct.unpack_from("<i", payload, 33)[0]
    struct.pack_into("<q", payload, 8, claimed_floats // dimension)  # ntotal
    struct.pack_into("<Q", payload, 41 if metric > 1 else 37, claimed_floats)  # the codes' length, in floats
    payload = (payload + bytes(payload_bytes))[:payload_bytes]
    meta = json.loads(attrs[META_ATTR])
    meta["payload_sha256"] = hashlib.sha256(bytes(payload)).hexdigest()
    attrs[META_ATTR] = json.dumps(meta, sort_keys=True)
    with h5py.File(path, "w") as f:
        for key, value in attrs.items():
            f.attrs[key] = value
        f.create_dataset(PAYLOAD_DATASET, data=np.frombuffer(bytes(payload), dtype=np.uint8), chunks=(1024,))
