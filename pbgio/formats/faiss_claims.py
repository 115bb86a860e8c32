"""What a FAISS index payload claims, read from its header and size fields, and bounded by the
payload's bytes before FAISS reads it.

FAISS's reader (``faiss/impl/index_read.cpp``) sizes each vector by the count its size field
declares before it reads the vector's bytes (``READVECTOR``: ``resize``, then read): a few
kilobytes whose header claims 2^30 floats make it allocate 4 GiB, whatever the payload holds.
:func:`payload_claims` walks the serialization of the index types ``pbgio index build`` writes
(:data:`KIND_FOURCC`, :func:`pbgio.index.library.new_index`) as FAISS reads it, reading only
the fixed fields and size fields and skipping every vector's bytes (a few reads of a few hundred
bytes; an IVF index's list sizes, 8 bytes a list), and raises :class:`ClaimError` at the first
field that claims more than the bytes after it, at a type pbg does not write (each is another
parser of untrusted bytes), or at a payload that does not end where its last vector does.
:func:`disagreement` compares what the header says with the index file's metadata.

The serialization, as FAISS 1.8 to 1.15 write it (``write_index`` in ``impl/index_write.cpp``;
the same bytes in every version between; little-endian; a *vector* is a uint64 count, then that
many items):

- the index header (``read_index_header``): ``d`` int32, ``ntotal`` int64, two unused int64,
  ``is_trained`` uint8, ``metric_type`` int32, and ``metric_arg`` float32 when ``metric_type`` > 1;
- ``IxFI`` (``IndexFlatIP``): fourcc, header, the codes: a vector of ``ntotal·d`` float32
  (``READXBVECTOR``: the count is in floats);
- ``IwSq`` (``IndexIVFScalarQuantizer``): fourcc, header, ``nlist`` uint64, ``nprobe`` uint64, the
  quantizer (an ``IxFI`` of ``nlist`` rows), the direct map (``type`` uint8, a vector of int64 and,
  when ``type`` is 2, a vector of int64 pairs), the scalar quantizer (``qtype`` int32,
  ``rangestat`` int32, ``rangestat_arg`` float32, ``d`` uint64, ``code_size`` uint64, ``trained``: a
  vector of float32), ``code_size`` uint64, ``by_residual`` uint8, then the inverted lists: ``ilar``,
  ``nlist`` uint64, ``code_size`` uint64, and either ``full`` and a vector of ``nlist`` list sizes
  or ``sprs`` and a vector of (list, size) pairs (uint64), then each non-empty list's
  ``size·code_size`` code bytes and ``size`` int64 ids;
- ``IHNf`` (``IndexHNSWFlat``): fourcc, header, the graph (vectors ``assign_probas`` of float64,
  ``cum_nneighbor_per_level`` of int32, ``levels`` of ``ntotal`` int32, ``offsets`` of ``ntotal + 1``
  uint64, ``neighbors`` of int32; then five int32: entry point, max level, efConstruction,
  efSearch, upper beam), then its storage: an ``IxFI`` of ``ntotal`` rows.

>>> import struct
>>> def flat(rows, d, floats=None):
...     header = b"IxFI" + struct.pack("<iqqqBi", d, rows, 1 << 20, 1 << 20, 1, 0)
...     return header + struct.pack("<Q", rows * d if floats is None else floats) + bytes(4 * rows * d)
>>> payload = flat(3, 4)
>>> payload_claims(lambda start, count: payload[start:start + count], len(payload))
PayloadClaims(kind='flat', dimension=4, rows=3, nlist=None)
>>> huge = flat(3, 4, floats=1 << 30)
>>> payload_claims(lambda start, count: huge[start:start + count], len(huge))
Traceback (most recent call last):
...
pbgio.formats.faiss_claims.ClaimError: IxFI codes at byte 37: ... a claim of 1,073,741,824 float32 (4,294,967,296 bytes)
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Read = Callable[[int, int], bytes]
"""``read(start, count)``: the ``count`` bytes of the payload from byte ``start`` (always within it)."""

KIND_FOURCC = {"flat": "IxFI", "ivf": "IwSq", "hnsw": "IHNf"}
"""The FAISS type each kind of :data:`pbgio.spec.index.KINDS` is serialized as (the only types read)."""
FLAT = "IxFI"
"""The type of an IVF index's quantizer and of an HNSW index's storage: a flat index by inner product."""
METRIC_INNER_PRODUCT = 0
"""FAISS's ``METRIC_INNER_PRODUCT``: every pbg index searches by inner product."""
QT_8BIT = 0
"""FAISS's ``ScalarQuantizer::QT_8bit``: an IVF index's rows, 8 bits a component (``code_size = d``)."""
DIRECT_MAP_HASHTABLE = 2
WINDOW = 4096
"""Bytes read at once: the fixed fields a read reaches usually lie within one window."""
HEADER = struct.Struct("<iqqqBi")
"""The index header up to ``metric_type`` (``metric_arg`` follows when ``metric_type`` > 1)."""
ROW_BYTES: dict[str, Callable[[int], int]] = {
    "flat": lambda d: 4 * d,  # its float32 row
    "ivf": lambda d: d + 8,  # its code (8 bits a component) and its int64 id
    "hnsw": lambda d: 4 * d + 12,  # its storage row, its level (int32) and its offset (uint64)
}
"""The least bytes a row of each kind takes in its payload, given ``d``: what bounds ``ntotal`` at the header."""


class ClaimError(ValueError):
    """A payload that is not an index pbg builds, or whose header claims more than its bytes hold."""


@dataclass(frozen=True)
class PayloadClaims:
    """What a payload's header says: its kind (the key of :data:`KIND_FOURCC`), dimension, rows,
    and an IVF index's list count."""

    kind: str
    dimension: int
    rows: int
    nlist: int | None = None


def payload_claims(read: Read, size: int) -> PayloadClaims:
    """What the ``size`` bytes that ``read`` gives claim, once every vector they declare fits in the
    bytes after its size field, the fields agree with each other, and the payload ends where its
    last vector does (:class:`ClaimError` otherwise). Reads the fixed fields and size fields only."""
    cursor = _Cursor(read, size)
    fourcc = cursor.fourcc("index type")
    kinds = {code: kind for kind, code in KIND_FOURCC.items()}
    if fourcc not in kinds:
        known = ", ".join(f"{code} ({kind})" for kind, code in KIND_FOURCC.items())
        raise ClaimError(f"expected a FAISS index type pbg builds ({known}), found {fourcc!r}: FAISS reads many "
                         "index types, and pbg loads only its own")
    kind = kinds[fourcc]
    dimension, rows = _header(cursor, fourcc, ROW_BYTES[kind])
    nlist = None
    if kind == "flat":
        _flat_codes(cursor, fourcc, rows, dimension)
    elif kind == "ivf":
        nlist = _ivf(cursor, rows, dimension)
    else:
        _hnsw(cursor, rows, dimension)
    if cursor.at != size:
        raise ClaimError(f"expected the payload to end at byte {cursor.at:,}, where its {fourcc} index ends, found "
                         f"{size:,} bytes")
    return PayloadClaims(kind, dimension, rows, nlist)


def disagreement(claims: PayloadClaims, *, kind: str, rows: int, dimension: int, nlist: int | None) -> str | None:
    """How the header (``claims``) disagrees with an index file's metadata (``kind``, ``rows``,
    ``dimension``, and an IVF index's ``nlist`` where recorded), or None.

    >>> disagreement(PayloadClaims("flat", 4, 9), kind="flat", rows=9, dimension=4, nlist=None) is None
    True
    >>> disagreement(PayloadClaims("flat", 4, 10), kind="flat", rows=9, dimension=4, nlist=None)
    "expected ntotal 9 (the metadata's rows), found ntotal 10 in the FAISS header: a stale or tampered index"
    """
    if claims.kind != kind:
        found = f"a {claims.kind} index ({KIND_FOURCC[claims.kind]})"
        return f"expected a {kind} index (the metadata's kind), found {found}: a stale or tampered index"
    fields = (("d", "dimension", dimension, claims.dimension), ("ntotal", "rows", rows, claims.rows),
              ("nlist", "nlist", nlist, claims.nlist))
    for field, said, expected, value in fields:
        if expected is not None and value is not None and expected != value:
            return (f"expected {field} {expected:,} (the metadata's {said}), found {field} {value:,} in the FAISS "
                    "header: a stale or tampered index")
    return None


def _header(cursor: _Cursor, fourcc: str, row_bytes: Callable[[int], int]) -> tuple[int, int]:
    """``(d, ntotal)`` of the index header at the cursor, once ``ntotal`` rows of ``row_bytes(d)``
    bytes (the least a row of this type takes) fit in what follows."""
    start = cursor.at
    d, ntotal, _, _, _, metric = HEADER.unpack(cursor.take(HEADER.size, f"{fourcc} header"))
    if metric != METRIC_INNER_PRODUCT:
        raise ClaimError(f"{fourcc} header at byte {start:,}: expected metric_type {METRIC_INNER_PRODUCT} (inner "
                         f"product, as every pbg index), found {metric}")
    if d < 1:
        raise ClaimError(f"{fourcc} header at byte {start:,}: expected d >= 1, found {d}")
    if ntotal < 0:
        raise ClaimError(f"{fourcc} header at byte {start:,}: expected ntotal >= 0, found {ntotal:,}")
    need = ntotal * row_bytes(d)
    if need > cursor.left:
        raise ClaimError(f"{fourcc} header at byte {start:,}: expected rows that fit in the {cursor.left:,} bytes "
                         f"after it, found ntotal {ntotal:,} rows of d {d:,} ({row_bytes(d):,} bytes a row at least: "
                         f"{need:,} bytes)")
    return d, ntotal


def _flat_codes(cursor: _Cursor, fourcc: str, rows: int, dimension: int) -> None:
    floats = cursor.vector(4, f"{fourcc} codes", "float32")
    if floats != rows * dimension:
        raise ClaimError(f"{fourcc} codes: expected ntotal·d = {rows:,}·{dimension:,} = {rows * dimension:,} float32, "
                         f"found {floats:,}")


def _nested_flat(cursor: _Cursor, what: str, rows: int, dimension: int) -> None:
    """An ``IxFI`` of ``rows`` rows of ``dimension`` inside another index (``what`` names it)."""
    fourcc = cursor.fourcc(what)
    if fourcc != FLAT:
        raise ClaimError(f"{what}: expected a FAISS {FLAT} index (as pbg builds it), found {fourcc!r}")
    d, ntotal = _header(cursor, fourcc, ROW_BYTES["flat"])
    if (d, ntotal) != (dimension, rows):
        raise ClaimError(f"{what}: expected {rows:,} rows of d {dimension:,}, found {ntotal:,} of d {d:,}")
    _flat_codes(cursor, f"{what} {fourcc}", rows, dimension)


def _ivf(cursor: _Cursor, rows: int, dimension: int) -> int:
    nlist = cursor.uint64("IwSq nlist")
    cursor.uint64("IwSq nprobe")
    _nested_flat(cursor, "IwSq quantizer", nlist, dimension)  # nlist centroids: bounds nlist by the payload
    map_type = cursor.uint8("IwSq direct map type")
    if map_type > DIRECT_MAP_HASHTABLE:
        raise ClaimError(f"IwSq direct map type: expected 0, 1 or 2, found {map_type}")
    cursor.vector(8, "IwSq direct map", "int64")
    if map_type == DIRECT_MAP_HASHTABLE:
        cursor.vector(16, "IwSq direct map hashtable", "(int64, int64) pairs")
    qtype, _, _ = struct.unpack("<iif", cursor.take(12, "IwSq scalar quantizer"))
    if qtype != QT_8BIT:
        raise ClaimError(f"IwSq scalar quantizer: expected qtype {QT_8BIT} (QT_8bit, as pbg builds it), found {qtype}")
    sq_d, sq_code_size = cursor.uint64("IwSq scalar quantizer d"), cursor.uint64("IwSq scalar quantizer code_size")
    if sq_d != dimension or sq_code_size != dimension:
        raise ClaimError(f"IwSq scalar quantizer: expected d and code_size {dimension:,} (8 bits a component of the "
                         f"index's d), found d {sq_d:,} and code_size {sq_code_size:,}")
    cursor.vector(4, "IwSq scalar quantizer trained", "float32")
    code_size = cursor.uint64("IwSq code_size")
    if code_size != sq_code_size:
        raise ClaimError(f"IwSq code_size: expected {sq_code_size:,} (the scalar quantizer's), found {code_size:,}")
    cursor.uint8("IwSq by_residual")
    _lists(cursor, nlist, code_size, rows)
    return nlist


def _lists(cursor: _Cursor, nlist: int, code_size: int, rows: int) -> None:
    """The inverted lists of an IVF index of ``nlist`` lists holding ``rows`` rows of ``code_size``
    bytes each (and an int64 id each)."""
    fourcc = cursor.fourcc("IwSq inverted lists")
    if fourcc != "ilar":
        raise ClaimError(f"IwSq inverted lists: expected 'ilar' (array lists, as pbg builds them), found "
                         f"{fourcc!r}")
    lists, size = cursor.uint64("ilar nlist"), cursor.uint64("ilar code_size")
    if (lists, size) != (nlist, code_size):
        raise ClaimError(f"ilar: expected nlist {nlist:,} and code_size {code_size:,} (the index's), found nlist "
                         f"{lists:,} and code_size {size:,}")
    list_type = cursor.fourcc("ilar list type")
    if list_type not in ("full", "sprs"):
        raise ClaimError(f"ilar list type: expected 'full' or 'sprs', found {list_type!r}")
    count = cursor.vector(8, "ilar list sizes", "uint64", skip=False)
    sizes = np.frombuffer(cursor.take(8 * count, "ilar list sizes"), "<u8")
    if list_type == "full" and count != nlist:
        raise ClaimError(f"ilar list sizes: expected {nlist:,} (one a list), found {count:,}")
    if list_type == "sprs":
        if count % 2 or count > 2 * nlist:
            raise ClaimError(f"ilar list sizes: expected (list, size) pairs of at most {nlist:,} lists, found "
                             f"{count:,} numbers")
        if count and int(sizes[0::2].max()) >= nlist:
            raise ClaimError(f"ilar list sizes: expected list numbers below nlist {nlist:,}, found "
                             f"{int(sizes[0::2].max()):,}")
        sizes = sizes[1::2]
    held = sum(sizes.tolist())
    need = held * (code_size + 8)
    if need > cursor.left:
        raise ClaimError(f"ilar lists at byte {cursor.at:,}: expected at most {cursor.left:,} bytes (what the payload "
                         f"holds after the list sizes), found lists of {held:,} rows of {code_size:,} code bytes and "
                         f"an int64 id ({need:,} bytes)")
    if held != rows:
        raise ClaimError(f"ilar lists: expected ntotal {rows:,} rows in all, found {held:,}")
    cursor.skip(need, "ilar lists")


def _hnsw(cursor: _Cursor, rows: int, dimension: int) -> None:
    cursor.vector(8, "IHNf assign_probas", "float64")
    cursor.vector(4, "IHNf cum_nneighbor_per_level", "int32")
    for name, itemsize, item, expected in (("levels", 4, "int32", rows), ("offsets", 8, "uint64", rows + 1)):
        count = cursor.vector(itemsize, f"IHNf {name}", item)
        if count != expected:
            raise ClaimError(f"IHNf {name}: expected {expected:,} (ntotal {rows:,}), found {count:,}")
    cursor.vector(4, "IHNf neighbors", "int32")
    cursor.skip(20, "IHNf entry point, max level, efConstruction, efSearch and upper beam")
    _nested_flat(cursor, "IHNf storage", rows, dimension)


class _Cursor:
    """Reads a payload's fields in order, a window of :data:`WINDOW` bytes at a time, refusing a
    read past its end."""

    def __init__(self, read: Read, size: int) -> None:
        self.read = read
        self.size = size
        self.at = 0
        self._window_start = 0
        self._window = b""

    @property
    def left(self) -> int:
        return self.size - self.at

    def take(self, count: int, what: str) -> bytes:
        if count > self.left:
            raise ClaimError(f"{what} at byte {self.at:,}: expected {count:,} bytes, found the payload's end "
                             f"({self.left:,} left)")
        offset = self.at - self._window_start
        if offset < 0 or offset + count > len(self._window):
            self._window_start, offset = self.at, 0
            self._window = self.read(self.at, min(self.left, max(count, WINDOW)))
        self.at += count
        return self._window[offset:offset + count]

    def skip(self, count: int, what: str) -> None:
        if count > self.left:
            raise ClaimError(f"{what} at byte {self.at:,}: expected {count:,} bytes, found the payload's end "
                             f"({self.left:,} left)")
        self.at += count

    def fourcc(self, what: str) -> str:
        return self.take(4, what).decode("latin-1")

    def uint8(self, what: str) -> int:
        return self.take(1, what)[0]

    def uint64(self, what: str) -> int:
        value: int = struct.unpack("<Q", self.take(8, what))[0]
        return value

    def vector(self, itemsize: int, what: str, item: str, *, skip: bool = True) -> int:
        """The count of the vector at the cursor, once its ``count·itemsize`` bytes fit in what follows
        its size field; skips them unless ``skip`` is false (the cursor then stands at the first)."""
        start = self.at
        count = self.uint64(what)
        if count * itemsize > self.left:
            raise ClaimError(f"{what} at byte {start:,}: expected at most {self.left:,} bytes (what the payload holds "
                             f"after the size field), found a claim of {count:,} {item} ({count * itemsize:,} bytes)")
        if skip:
            self.at += count * itemsize
        return count
