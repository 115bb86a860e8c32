"""A Parquet file's own claims, checked before polars decodes it.

polars trusts a Parquet file's page headers: a data page that claims ``-1`` values makes it
reserve 2^61 bytes for the page's validity bitmap, and Rust aborts the whole process when an
allocation fails, so no exception ever reaches the importer. This module reads what the file
says about itself (the footer, then every page header: a few dozen bytes each, never the page
data) and refuses a file whose claims cannot all be true, with the file, the column, the row
group and the byte offset in the error:

- the file starts and ends with ``PAR1`` and its footer lies inside it;
- the footer and each page header are well-formed Thrift (compact protocol), read with bounds:
  no list or string may be longer than the bytes left, nesting is shallow;
- row counts are not negative and add up; a column chunk lies inside the file, before the
  footer, and holds at least as many values as its row group has rows;
- each page lies inside its column chunk, its sizes and counts are not negative, the values of
  a chunk's data pages add up to the chunk's count, and no page claims more decompressed bytes
  than its codec can produce from the compressed bytes it has.

The check reads only headers, so it costs one small read per page (pages hold about a
megabyte each in files written by polars, Arrow or Spark).

>>> import io, polars as pl
>>> buffer = io.BytesIO()
>>> pl.DataFrame({"lhs": ["a", "b"], "rel": ["r", "r"], "rhs": ["b", "c"]}).write_parquet(buffer)
>>> check_parquet(io.BytesIO(buffer.getvalue()), "edges.parquet")
2
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

from pbgio.errors import InputError

_MAGIC = b"PAR1"
_MAX_DEPTH = 32
_FIRST_HEADER_READ = 256

# Codec ids (parquet.thrift CompressionCodec) and the most bytes each can produce per compressed
# byte (with room to spare): snappy ~21, gzip/deflate 1032, lz4 255; zstd and brotli blocks that
# repeat one byte reach tens of thousands, so those get 2^16.
_CODEC_RATIO = {0: 1, 1: 64, 2: 1100, 3: 512, 4: 1 << 16, 5: 512, 6: 1 << 16, 7: 512}

# Page types (parquet.thrift PageType).
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 1, 2, 3


class _Truncated(Exception):
    """The bytes ran out inside a Thrift structure."""


class _Malformed(Exception):
    """A Thrift structure that no writer produces."""


class _Reader:
    """Thrift compact protocol, read into nested ``{field id: value}`` dicts, with bounds."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise _Truncated
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise _Malformed("a variable-length integer longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise _Truncated
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def value(self, kind: int, depth: int) -> Any:
        if kind in (1, 2):  # booleans live in the field header; inside a list they take a byte
            return kind == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            return struct.unpack("<d", self.take(8))[0]
        if kind == 8:
            return self.take(self.varint())
        if kind in (9, 10):
            return self.sequence(depth)
        if kind == 11:
            return self.mapping(depth)
        if kind == 12:
            return self.struct(depth + 1)
        raise _Malformed(f"an unknown Thrift type {kind}")

    def sequence(self, depth: int) -> list[Any]:
        header = self.byte()
        size, kind = header >> 4, header & 0x0F
        if size == 15:
            size = self.varint()
        if size > len(self.data) - self.pos:  # every element takes at least one byte
            raise _Truncated
        if kind in (1, 2):
            return [self.byte() == 1 for _ in range(size)]
        return [self.value(kind, depth) for _ in range(size)]

    def mapping(self, depth: int) -> dict[Any, Any]:
        size = self.varint()
        if size == 0:
            return {}
        if 2 * size > len(self.data) - self.pos:
            raise _Truncated
        kinds = self.byte()
        out: dict[Any, Any] = {}
        for _ in range(size):
            key = self.value(kinds >> 4, depth)
            out[key if not isinstance(key, list | dict) else repr(key)] = self.value(kinds & 0x0F, depth)
        return out

    def struct(self, depth: int = 0) -> dict[int, Any]:
        if depth > _MAX_DEPTH:
            raise _Malformed(f"structures nested more than {_MAX_DEPTH} deep")
        fields: dict[int, Any] = {}
        last = 0
        while True:
            header = self.byte()
            if header == 0:
                return fields
            delta, kind = header >> 4, header & 0x0F
            field = last + delta if delta else self.zigzag()
            fields[field] = self.value(kind, depth)
            last = field


@dataclass
class _Where:
    path: str
    row_group: int
    column: str

    def fail(self, what: str) -> InputError:
        return InputError(self.path, None, f"expected a Parquet file whose structure holds together, found "
                          f"{what} (row group {self.row_group}, column {self.column})")


def check_parquet(source: BinaryIO, path: str) -> int:
    """Check the Parquet file open in ``source``; returns its row count.

    Raises :class:`~pbgio.errors.InputError` naming ``path`` and the rule broken.
    """
    size = source.seek(0, os.SEEK_END)
    if size < 12:
        raise _unreadable(path, f"{size} bytes, fewer than a Parquet file's 12 bytes of framing")
    source.seek(0)
    head = source.read(4)
    source.seek(size - 8)
    tail = source.read(8)
    if head != _MAGIC or tail[4:] != _MAGIC:
        raise _unreadable(path, "no PAR1 marker at its start and end")
    footer_length = struct.unpack("<I", tail[:4])[0]
    footer_start = size - 8 - footer_length
    if footer_start < 4:
        raise _unreadable(path, f"a footer of {footer_length} bytes in a file of {size}")
    source.seek(footer_start)
    try:
        meta = _Reader(source.read(footer_length)).struct()
    except (_Truncated, _Malformed) as exc:
        raise _unreadable(path, f"a damaged footer ({_reason(exc)})") from None
    names = _column_names(meta)
    rows = _int(meta.get(3, 0))
    groups = meta.get(4, [])
    if not isinstance(groups, list):
        raise _unreadable(path, "a footer whose row groups are not a list")
    total = 0
    for index, group in enumerate(groups):
        total += _check_row_group(source, path, index, group, names, footer_start)
    if rows != total:
        raise _unreadable(path, f"a footer claiming {rows} rows while its row groups hold {total}")
    return total


def _check_row_group(source: BinaryIO, path: str, index: int, group: Any, names: list[str],
                     footer_start: int) -> int:
    where = _Where(path, index, "-")
    if not isinstance(group, dict) or not isinstance(group.get(1), list):
        raise where.fail("a row group without a column list")
    rows = _int(group.get(3, 0))
    if rows < 0:
        raise where.fail(f"{rows} rows")
    for position, chunk in enumerate(group[1]):
        where.column = names[position] if position < len(names) else f"#{position}"
        _check_chunk(source, where, chunk, rows, footer_start)
    return rows


def _check_chunk(source: BinaryIO, where: _Where, chunk: Any, rows: int, footer_start: int) -> None:
    if not isinstance(chunk, dict) or not isinstance(chunk.get(3), dict):
        raise where.fail("a column chunk without its metadata")
    if chunk.get(1):
        raise where.fail("a column chunk stored in another file")
    meta = chunk[3]
    values = _int(meta.get(5, 0))
    compressed = _int(meta.get(7, 0))
    codec = _int(meta.get(4, 0))
    data_offset = _int(meta.get(9, 0))
    dictionary_offset = meta.get(11)
    start = data_offset if not dictionary_offset else min(data_offset, _int(dictionary_offset))
    if values < rows:
        raise where.fail(f"a column chunk of {values} values in a row group of {rows} rows")
    if compressed < 0 or start < 4 or start + compressed > footer_start:
        raise where.fail(f"a column chunk at bytes {start}..{start + compressed}, outside the data "
                         f"(bytes 4..{footer_start})")
    end = start + compressed
    counted = 0
    offset = start
    while offset < end:
        header, header_size = _page_header(source, where, offset, end)
        kind = _int(header.get(1, -1))
        uncompressed = _int(header.get(2, -1))
        page_bytes = _int(header.get(3, -1))
        if uncompressed < 0 or page_bytes < 0 or offset + header_size + page_bytes > end:
            raise where.fail(f"a page at byte {offset} of {page_bytes} bytes ({uncompressed} decompressed) "
                             f"outside its column chunk (bytes {start}..{end})")
        if uncompressed > page_bytes * _CODEC_RATIO.get(codec, 1 << 16) + 1024:
            raise where.fail(f"a page at byte {offset} claiming {uncompressed} decompressed bytes from "
                             f"{page_bytes} compressed ones")
        counted += _page_values(where, offset, kind, header, values)
        offset += header_size + page_bytes
    if counted != values:
        raise where.fail(f"data pages holding {counted} values in a column chunk of {values}")


def _page_values(where: _Where, offset: int, kind: int, header: dict[int, Any], chunk_values: int) -> int:
    """The values a page adds to its chunk's count (data pages only), checked."""
    body = {_DATA_PAGE: 5, _INDEX_PAGE: 6, _DICTIONARY_PAGE: 7, _DATA_PAGE_V2: 8}.get(kind)
    if body is None:
        raise where.fail(f"a page at byte {offset} of unknown type {kind}")
    if kind == _INDEX_PAGE:
        return 0
    fields = header.get(body)
    if not isinstance(fields, dict):
        raise where.fail(f"a page at byte {offset} without its type's header")
    count = _int(fields.get(1, -1))
    # A dictionary entry takes at least a bit (booleans); a data page's values are its chunk's.
    most = 8 * _int(header.get(2, 0)) + 8 if kind == _DICTIONARY_PAGE else chunk_values
    if not 0 <= count <= most:
        raise where.fail(f"a page at byte {offset} claiming {count} values (at most {most} fit)")
    if kind == _DATA_PAGE_V2:
        nulls, rows = _int(fields.get(2, -1)), _int(fields.get(3, -1))
        levels = _int(fields.get(5, 0)) + _int(fields.get(6, 0))
        if not 0 <= nulls <= count or not 0 <= rows <= count or levels < 0 \
                or levels > _int(header.get(3, 0)) or _int(fields.get(5, 0)) < 0:
            raise where.fail(f"a page at byte {offset} claiming {nulls} nulls, {rows} rows and {levels} "
                             f"bytes of levels among {count} values")
    return 0 if kind == _DICTIONARY_PAGE else count


def _page_header(source: BinaryIO, where: _Where, offset: int, end: int) -> tuple[dict[int, Any], int]:
    """The page header at ``offset`` and its size in bytes (read in growing steps, never past ``end``)."""
    want = _FIRST_HEADER_READ
    while True:
        source.seek(offset)
        data = source.read(min(want, end - offset))
        reader = _Reader(data)
        try:
            return reader.struct(), reader.pos
        except _Truncated:
            if len(data) >= end - offset:
                raise where.fail(f"a page header at byte {offset} cut off by the column chunk's end") from None
            want *= 8
        except _Malformed as exc:
            raise where.fail(f"a damaged page header at byte {offset} ({exc})") from None


def _column_names(meta: dict[int, Any]) -> list[str]:
    """Leaf column names from the footer's schema (elements without children), for messages."""
    schema = meta.get(2, [])
    if not isinstance(schema, list):
        return []
    names: list[str] = []
    for element in schema[1:]:
        if isinstance(element, dict) and not element.get(5) and isinstance(element.get(4), bytes):
            names.append(element[4].decode("utf-8", "replace"))
    return names


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _reason(exc: Exception) -> str:
    return "it ends inside a structure" if isinstance(exc, _Truncated) else str(exc)


def _unreadable(path: str, what: str) -> InputError:
    return InputError(path, None, f"expected a Parquet file, found {what}")
