"""Trained embeddings of a checkpoint version as tables: TSV, Parquet, or .npy with names.

Rows are the entities of a type in layout order (partition 0, then 1, …), each named
from ``entity_names_{type}_{part}.json`` (a featurized type's rows are its features).
As in the original's ``torchbiggraph_export_to_tsv``, when the config has
``global_emb: true`` the type's global embedding (``entities/{type}/global_embedding``
in ``model.vN.h5``) is **added** to every row, in float32, because that is the vector
the model scores with; ``add_global=False`` exports the stored rows unchanged.

Formats (values are float32 and read back bit for bit):

- ``tsv``: one file, every type: ``name<TAB>v0<TAB>v1…`` per line, the original's layout,
  with each value in its shortest round-trip decimal form (the original's ``%.9f``
  loses small values). Names holding a tab or a line break are refused.
- ``parquet``: one file per type: ``name`` and ``embedding`` (a fixed-size list of
  float32), or ``name`` and ``dim_0 … dim_{d-1}`` with ``parquet_layout="columns"``.
- ``npy``: per type a ``(count, dim)`` float32 ``.npy`` and a JSON list of names,
  ``{type}.npy`` and ``{type}.names.json``.

``output`` is the TSV file; for Parquet and npy it is a directory (``{type}.parquet``,
``{type}.npy``), or, when one type is exported, may name the file itself
(``user.parquet``; ``user.npy`` with ``user.names.json`` beside it).

Memory: a partition's rows are read a row chunk at a time (``PBG_ROW_CHUNK_BYTES``,
:meth:`pbgio.checkpoint.CheckpointDir.iter_embedding_rows`), beside its names as one string
column; never a whole partition's table, never a whole type's names.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Literal

import numpy as np
import polars as pl
from numpy.typing import NDArray

from pbgio.config import ConfigSchema
from pbgio.entities import iter_entity_names, read_entity_count, write_name_list
from pbgio.exporters.common import (
    ExportError,
    ExportReport,
    check_free,
    consistent_version,
    output_file,
)
from pbgio.exporters.global_rows import add_global_embedding, global_embeddings
from pbgio.layout import CheckpointVersion, Layout, open_checkpoint
from pbgio.progress import Progress
from pbgio.spec import naming
from pbgio.storage import AnyPath

EmbeddingFormat = Literal["tsv", "parquet", "npy"]
ParquetLayout = Literal["list", "columns"]
FORMATS: tuple[EmbeddingFormat, ...] = ("tsv", "parquet", "npy")
ROWS_PER_WRITE = 1 << 16
Floats = NDArray[np.float32]
RowChunk = tuple[pl.Series, Floats]
"""The names and rows (as exported) of one row chunk of a partition."""
Partition = tuple[pl.Series, Iterator[RowChunk]]
"""A partition's names (all of them, checked) and its row chunks, read as they are iterated."""


@consistent_version
def export_embeddings(
    config: Layout | ConfigSchema | str | AnyPath,
    output: str | Path,
    *,
    fmt: EmbeddingFormat = "tsv",
    version: int | None = None,
    entity_types: Sequence[str] | None = None,
    add_global: bool = True,
    parquet_layout: ParquetLayout = "list",
    checkpoint: str | AnyPath | None = None,
    base: str | AnyPath | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ExportReport:
    """Write the embeddings of ``version`` (default: the committed one) of every (or the given) type."""
    started = time.perf_counter()
    if fmt not in FORMATS:
        raise ExportError(f"expected a format among {FORMATS}, found {fmt!r}")
    if parquet_layout not in ("list", "columns"):
        raise ExportError(f"expected parquet_layout 'list' or 'columns', found {parquet_layout!r}")
    source = open_checkpoint(config, base=base, checkpoint=checkpoint, version=version)
    cfg = source.config
    types = list(entity_types) if entity_types else list(cfg.entities)
    unknown = [t for t in types if t not in cfg.entities]
    if unknown:
        raise ExportError(f"expected entity types of the config {sorted(cfg.entities)}, found {unknown}")
    report = ExportReport(version=source.version)
    shift = global_embeddings(source, types) if add_global and cfg.global_emb else {}
    report.global_added = sorted(shift)
    progress = progress or Progress()
    progress.start("exporting embeddings", total=sum(cfg.num_partitions(t) for t in types))
    output = Path(output)
    if fmt == "tsv":
        with output_file(output, overwrite) as tmp, tmp.open("wb") as out:
            for entity_type in types:
                parts = _partitions(source, entity_type, shift.get(entity_type), progress)
                for part, (names, chunks) in enumerate(parts):
                    _check_tsv_names(names, source, entity_type, part)
                    for chunk_names, values in chunks:
                        write_tsv(out, chunk_names, values)
                    report.rows[entity_type] = report.rows.get(entity_type, 0) + len(names)
        report.outputs.append(str(output))
    else:
        for entity_type, path in _targets(output, fmt, types).items():
            parts = _partitions(source, entity_type, shift.get(entity_type), progress)
            if fmt == "parquet":
                chunks, dimension = _name_chunk_frames(parts), cfg.entity_dimension(entity_type)
                report.rows[entity_type] = _write_parquet(path, chunks, dimension, parquet_layout, overwrite)
                report.outputs.append(str(path))
            else:
                names_path = path.with_name(f"{path.stem}.names.json")
                report.rows[entity_type] = _write_npy(path, names_path, source, entity_type, parts, overwrite)
                report.outputs += [str(path), str(names_path)]
    progress.stop()
    report.seconds = time.perf_counter() - started
    return report


def _partitions(source: CheckpointVersion, entity_type: str, shift: Floats | None,
                progress: Progress) -> Iterator[Partition]:
    """Each partition's names, checked against its row count, and its row chunks (global embedding
    added when ``shift`` is given); a partition counts as done once its chunks are read."""
    for part in range(source.config.num_partitions(entity_type)):
        shape = source.checkpoint.embeddings_shape(entity_type, part, source.version)
        names = partition_names(source, entity_type, part, shape[0])
        yield names, _chunks(source, entity_type, part, shape, names, shift, progress)


def _chunks(source: CheckpointVersion, entity_type: str, part: int, shape: tuple[int, ...], names: pl.Series,
            shift: Floats | None, progress: Progress) -> Iterator[RowChunk]:
    """A partition's rows a row chunk at a time (``PBG_ROW_CHUNK_BYTES``), each with its slice of ``names``."""
    for start, values in _stored_chunks(source, entity_type, part, shape):
        yield names.slice(start, len(values)), add_global_embedding(values, shift, entity_type)
    progress.advance()


def _stored_chunks(source: CheckpointVersion, entity_type: str, part: int,
                   shape: tuple[int, ...]) -> Iterator[tuple[int, Floats]]:
    """``(first row, rows)`` of a partition's table as stored; an empty table is one empty chunk, so
    its dimension is checked (and its frame written) as any other's."""
    if not shape[0]:
        return iter([(0, np.zeros(shape, dtype=np.float32))])
    return source.checkpoint.iter_embedding_rows(entity_type, part, source.version)


def _name_chunk_frames(parts: Iterator[Partition]) -> Iterator[RowChunk]:
    """The rows of every partition, in order, cut where its names' chunks end (the chunks of
    :func:`pbgio.entities.iter_entity_names`, at most ``NAMES_PER_CHUNK`` names), whatever the row chunk."""
    for names, chunks in parts:
        yield from _by_name_chunks(names, chunks)


def _by_name_chunks(names: pl.Series, chunks: Iterator[RowChunk]) -> Iterator[RowChunk]:
    """A partition's row chunks re-cut to the chunk lengths of ``names`` (memory: a row chunk and a
    names chunk); an empty partition is one empty piece."""
    sizes = deque(names.chunk_lengths())
    held: list[Floats] = []
    count = row = 0
    for _, values in chunks:
        held.append(values)
        count += len(values)
        while sizes and count >= sizes[0]:
            size = sizes.popleft()
            block = np.concatenate(held) if len(held) > 1 else held[0]
            yield names.slice(row, size), block[:size]
            held, count, row = [block[size:]], count - size, row + size


def partition_names(source: CheckpointVersion, entity_type: str, part: int, num_rows: int) -> pl.Series:
    """The names of a partition's ``num_rows`` checkpoint rows (``entity_names_{type}_{part}.json``),
    streamed into a string column (a few bytes a name over their UTF-8, not a list of objects)."""
    chunks: list[pl.Series] = []
    row = 0
    for chunk in iter_entity_names(source.entity_path, entity_type, part):
        try:
            chunks.append(pl.Series("name", chunk, dtype=pl.String))
        except UnicodeEncodeError:
            raise _unencodable(source, entity_type, part, row, chunk) from None
        row += len(chunk)
    names = pl.concat(chunks) if chunks else pl.Series("name", [], dtype=pl.String)
    if len(names) != num_rows:
        path = source.checkpoint.embeddings_path(entity_type, part, source.version)
        raise ExportError(f"{path}: expected {len(names)} rows (entity_names_{entity_type}_{part}.json), "
                          f"found {num_rows}")
    return names


def _unencodable(source: CheckpointVersion, entity_type: str, part: int, row: int, chunk: list[str]) -> ExportError:
    """A name that is no Unicode text (a lone surrogate, which JSON's \\u escapes can spell)."""
    for offset, name in enumerate(chunk):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            path = source.entity_path / naming.entity_names_file(entity_type, part)
            return ExportError(f"{path}: name {row + offset} ({name[:40]!r}) holds the lone surrogate "
                               f"{name[exc.start]!r} at character {exc.start}, which no Unicode text (TSV, "
                               "Parquet) can hold [entity-names-format]")
    return ExportError(f"{source.entity_path}: names of {entity_type!r} partition {part} cannot be encoded")


def _check_tsv_names(names: pl.Series, source: CheckpointVersion, entity_type: str, part: int) -> None:
    rows = names.str.contains(r"[\t\n\r]").arg_true()
    if len(rows):
        path = source.entity_path / naming.entity_names_file(entity_type, part)
        row = int(rows[0])
        more = f" ({len(rows)} names in all)" if len(rows) > 1 else ""
        raise ExportError(f"{path}: name {row} ({names[row][:40]!r}) holds a tab or a line break, which TSV "
                          f"cannot hold{more}; export {entity_type!r} to Parquet or npy instead")


def _value_columns(values: Floats) -> dict[str, Floats]:
    return {f"dim_{i}": values[:, i] for i in range(values.shape[1])}


def write_tsv(out: IO[bytes], names: pl.Series, values: Floats) -> None:
    """``name<TAB>v0<TAB>v1…`` per row, each value in its shortest round-trip decimal form."""
    for start in range(0, len(names), ROWS_PER_WRITE):
        end = min(start + ROWS_PER_WRITE, len(names))
        frame = pl.DataFrame({"name": names.slice(start, end - start), **_value_columns(values[start:end])})
        frame.write_csv(out, separator="\t", include_header=False, quote_style="never", line_terminator="\n")


def _targets(output: Path, fmt: str, types: list[str]) -> dict[str, Path]:
    if output.suffix == f".{fmt}":
        if len(types) != 1:
            raise ExportError(f"{output}: a single .{fmt} file holds one entity type, found {len(types)} to "
                              "export (give a directory, or pick one type)")
        return {types[0]: output}
    return {t: output / f"{t}.{fmt}" for t in types}


def _frame(names: pl.Series, values: Floats, layout: ParquetLayout) -> pl.DataFrame:
    if layout == "list":
        array = pl.Series("embedding", values, dtype=pl.Array(pl.Float32, values.shape[1]))
        return pl.DataFrame([names, array])
    return pl.DataFrame({"name": names, **_value_columns(values)})


def _write_parquet(path: Path, chunks: Iterator[RowChunk], dimension: int,
                   layout: ParquetLayout, overwrite: bool) -> int:
    """Stream the pieces into one Parquet file, a frame each (memory: one row chunk, and the rows
    polars holds for a row group).

    Polars cuts row groups by the chunks of the frames it is given (it gathers them to about 82k
    rows). The pieces are cut where the names file's chunks end, as the frames of whole partitions
    (names read in those chunks, concatenated) were cut before rows were read a chunk at a time, so
    the file's bytes are the same whatever ``PBG_ROW_CHUNK_BYTES`` is."""
    from polars.io.plugins import register_io_source

    schema: dict[str, pl.DataType] = {"name": pl.String()}
    if layout == "list":
        schema["embedding"] = pl.Array(pl.Float32, dimension)
    else:
        schema.update({f"dim_{i}": pl.Float32() for i in range(dimension)})
    rows = 0

    def frames(with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None,
               batch_size: int | None) -> Iterator[pl.DataFrame]:
        nonlocal rows
        for names, values in chunks:
            if values.shape[1] != dimension:
                raise ExportError(f"expected dimension {dimension}, found {values.shape[1]}")
            rows += len(names)
            frame = _frame(names, values, layout)
            yield frame.select(with_columns) if with_columns is not None else frame

    lazy = register_io_source(frames, schema=schema)
    with output_file(path, overwrite) as tmp:
        lazy.sink_parquet(tmp)
    return rows


def _write_npy(path: Path, names_path: Path, source: CheckpointVersion, entity_type: str,
               parts: Iterator[Partition], overwrite: bool) -> int:
    """A (count, dim) float32 .npy written a row chunk at a time, and the names beside it in the same
    pass (memory: one row chunk, whatever the type's row count: rows are written, not mapped)."""
    from numpy.lib.format import open_memmap

    cfg = source.config
    total = sum(read_entity_count(source.entity_path, entity_type, p)
                for p in range(cfg.num_partitions(entity_type)))
    stored = sum(source.checkpoint.embeddings_shape(entity_type, p, source.version)[0]
                 for p in range(cfg.num_partitions(entity_type)))
    if stored != total:  # the file is sized from the counts: never beyond the rows there are to write
        raise ExportError(f"expected {total:,} rows for {entity_type!r} (entity counts), found {stored:,} in the "
                          f"checkpoint's embeddings (version {source.version})")
    check_free(names_path, overwrite)
    shape = (total, cfg.entity_dimension(entity_type))
    with output_file(path, overwrite) as tmp:
        header = open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape).offset  # the header; the file sized
        with tmp.open("r+b") as out:
            os.posix_fallocate(out.fileno(), 0, tmp.stat().st_size)  # claim the disk space: a full disk fails now
            out.seek(header)
            write_name_list(names_path, _fill(out, shape, parts, entity_type))
    return total


def _fill(out: IO[bytes], shape: tuple[int, int], parts: Iterator[Partition], entity_type: str) -> Iterator[str]:
    """Write every partition's rows to ``out`` in order, giving each chunk's names once its rows are
    written (to the names file written beside it); the rows must be ``shape`` exactly."""
    total, dimension = shape
    row = 0
    for names, chunks in parts:
        first = row
        for chunk_names, values in chunks:
            if values.shape[1] != dimension or first + len(names) > total:
                raise ExportError(
                    f"expected {total} rows of dimension {dimension} for {entity_type!r} (entity "
                    f"counts, config), found rows of dimension {values.shape[1]} beyond row {first}")
            out.write(values.data)
            row += len(values)
            yield from chunk_names.to_list()
    if row != total:
        raise ExportError(f"expected {total} rows for {entity_type!r} (entity counts), found {row}")
