"""Searching a built index: :func:`open_index` loads it once (after refusing a stale, renamed or
damaged file), and the :class:`EmbeddingIndex` it returns answers any number of searches.

A search asks the index for ``candidates`` rows per query (its approximate order), then reads
those rows from the checkpoint and scores them exactly (:class:`pbgio.topk.VectorScorer`, the
scorer of the exact scan), so every score returned is exact and equal scores rank by
(partition, row) as in the exact scan. What an index can miss is a row it never proposes;
``candidates`` (default :data:`DEFAULT_CANDIDATES`) and the kind's ``nprobe``/``ef_search``
trade that against time.

>>> import tempfile, pathlib
>>> from pbgio.testing import small_valid_layout, write_layout
>>> from pbgio.index.build import build_index
>>> config = write_layout(pathlib.Path(tempfile.mkdtemp()), small_valid_layout(featurized=False))
>>> _ = build_index(config, "user", metric="cos")
>>> with open_index(config, "user") as index:
...     query = index.rows(np.array([1]), np.array([3]))
...     [best] = index.top_k(query, k=2)
>>> best[0][1:]  # (score, partition, offset): by cos, the row itself scores highest
(1, 3)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pbgio.checks import index as checks
from pbgio.checks import raise_first
from pbgio.config import ConfigSchema
from pbgio.errors import MissingArtifactError, PbgioError, StaleIndexError
from pbgio.index import library
from pbgio.index_file import IndexMeta, TypeRows, load_index_payload, read_index_meta, stale_issue
from pbgio.layout import CheckpointVersion, Layout, open_checkpoint
from pbgio.spec import naming
from pbgio.storage import AnyPath
from pbgio.topk import TopK, VectorScorer

DEFAULT_CANDIDATES = 100
"""Rows per query the index proposes for exact re-ranking (at least ``k``)."""
QUERY_BLOCK = 256
"""Queries re-ranked together (their candidate rows are read once per partition)."""

Floats = NDArray[np.float32]
Scored = list[tuple[float, int, int]]


class IndexSearchError(PbgioError, ValueError):
    """A search the index cannot answer: a query of the wrong dimension, a bad k or candidates."""


class EmbeddingIndex:
    """A loaded index of one entity type's rows of one checkpoint version (a context manager)."""

    def __init__(self, source: CheckpointVersion, path: AnyPath, meta: IndexMeta, index: Any, rows: TypeRows,
                 params: dict[str, int]) -> None:
        self.source = source
        self.path = path
        self.meta = meta
        self.params = params
        self.rows_source = rows
        self._index = index
        self._starts = np.concatenate([[0], np.cumsum(meta.partition_rows)]).astype(np.int64)

    @property
    def entity_type(self) -> str:
        return self.meta.entity_type

    @property
    def version(self) -> int:
        return self.meta.version

    @property
    def metric(self) -> str:
        return self.meta.metric

    def describe(self) -> str:
        return self.meta.searched(self.params)

    def __enter__(self) -> EmbeddingIndex:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Free the index (its memory); later searches fail."""
        self._index = None

    # ---- the index's own (approximate) answer
    def propose(self, queries: Floats, count: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(partitions, offsets)`` of up to ``count`` rows per query, ``[Q, count]`` each, in the
        index's approximate order; -1 in both where it found fewer."""
        if self._index is None:
            raise IndexSearchError(f"{self.path}: the index was closed")
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        if queries.shape[1] != self.meta.dimension:
            raise IndexSearchError(f"expected queries of dimension {self.meta.dimension}, found {queries.shape[1]}")
        ids = library.search(self._index, library.prepare(queries, self.metric), count, self.meta.kind, self.params)
        found = ids >= 0
        parts = np.where(found, np.searchsorted(self._starts, ids, side="right") - 1, -1)
        offsets = np.where(found, ids - self._starts[np.maximum(parts, 0)], -1)
        return parts.astype(np.int64), offsets.astype(np.int64)

    # ---- exact rows and exact top-k
    def rows(self, partitions: NDArray[np.int64], offsets: NDArray[np.int64]) -> Floats:
        """The indexed rows (global embedding added as the index has it) at the positions given,
        read from the checkpoint: one read per partition."""
        parts = np.asarray(partitions, dtype=np.int64).reshape(-1)
        offs = np.asarray(offsets, dtype=np.int64).reshape(-1)
        out = np.empty((len(parts), self.meta.dimension), np.float32)
        for part in np.unique(parts):
            members = np.flatnonzero(parts == part)
            out[members] = self.rows_source.rows(int(part), offs[members])
        return out

    def top_k(self, queries: Floats, k: int = 10, *, candidates: int | None = None,
              exclude: Sequence[tuple[int, int] | None] | None = None) -> list[Scored]:
        """The best ``k`` rows of each query by exact score: ``(score, partition, offset)`` best
        first. ``exclude[i]``: a position left out of query ``i``'s answer (the query itself)."""
        if k < 1:
            raise IndexSearchError(f"expected k >= 1, found {k}")
        count = max(k + 1, DEFAULT_CANDIDATES if candidates is None else candidates)
        if candidates is not None and candidates < k:
            raise IndexSearchError(f"expected candidates >= k ({k}), found {candidates}")
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        results: list[Scored] = []
        for start in range(0, len(queries), QUERY_BLOCK):
            block = queries[start:start + QUERY_BLOCK]
            parts, offsets = self.propose(block, count)
            results += self._rerank(block, parts, offsets, k,
                                    None if exclude is None else exclude[start:start + QUERY_BLOCK])
        return results

    def _rerank(self, queries: Floats, parts: NDArray[np.int64], offsets: NDArray[np.int64], k: int,
                exclude: Sequence[tuple[int, int] | None] | None) -> list[Scored]:
        found = parts >= 0
        ids = np.unique(np.stack([parts[found], offsets[found]], axis=1), axis=0)
        if len(ids) == 0:
            return [[] for _ in queries]
        rows = self.rows(ids[:, 0], ids[:, 1])
        scores = VectorScorer(queries, self.metric, "cpu")(rows)  # type: ignore[arg-type]
        key = ids[:, 0] * (int(self._starts[-1]) + 1) + ids[:, 1]
        out = []
        for i in range(len(queries)):
            mine = found[i]
            where = np.searchsorted(key, parts[i][mine] * (int(self._starts[-1]) + 1) + offsets[i][mine])
            if exclude is not None and exclude[i] is not None:
                skip = exclude[i]
                assert skip is not None
                where = where[(ids[where, 0] != skip[0]) | (ids[where, 1] != skip[1])]
            top = TopK(k)
            for part in np.unique(ids[where, 0]):
                chosen = where[ids[where, 0] == part]
                top.add(scores[i, chosen], int(part), ids[chosen, 1])
            out.append(top.items())
        return out


def open_index(
    config: Layout | ConfigSchema | str | AnyPath,
    entity_type: str,
    *,
    version: int | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
    checkpoint: str | AnyPath | None = None,
    base: str | AnyPath | None = None,
) -> EmbeddingIndex:
    """Load the index of ``entity_type`` for ``version`` (default: the committed one).

    Refused, never used: a missing index (:class:`~pbgio.errors.MissingArtifactError`, naming
    the index of another version when there is one), a file that is not an index or names
    another version (:class:`~pbgio.errors.FormatError`), an index whose tables changed
    (:class:`~pbgio.errors.StaleIndexError`), a damaged payload. ``nprobe``/``ef_search``
    override the defaults the index was built with.
    """
    source = open_checkpoint(config, base=base, checkpoint=checkpoint, version=version)
    return load_index(source, entity_type, nprobe=nprobe, ef_search=ef_search)


def load_index(source: CheckpointVersion, entity_type: str, *, nprobe: int | None = None,
               ef_search: int | None = None) -> EmbeddingIndex:
    """:func:`open_index` for a checkpoint version already located (config, entity directory,
    checkpoint directory, version)."""
    path = source.checkpoint.path / naming.index_file(entity_type, source.version)
    if not path.is_file():
        raise _missing(source, entity_type, path)
    meta = read_index_meta(path)
    shown = str(path)
    types = {name: e.featurized for name, e in source.config.entities.items()}
    raise_first([checks.entity_type(shown, dataclasses.asdict(meta), types),
                 checks.name_mismatch(shown, entity_type, source.version, dataclasses.asdict(meta))])
    raise_first([stale_issue(source.config, source.checkpoint, source.version, meta, shown)], StaleIndexError)
    try:
        index = load_index_payload(path, meta, library.read)
    except (RuntimeError, MemoryError) as exc:  # intact by its digest, yet not an index FAISS can read
        raise_first([checks.unloadable(shown, f"expected a {meta.library} index, found bytes it cannot read "
                                              f"({str(exc).strip().splitlines()[-1][:200]})")])
    if library.row_count(index) != meta.rows or library.dimension(index) != meta.dimension:
        raise_first([checks.unloadable(shown, f"expected an index of {meta.rows:,} rows of dimension "
                                              f"{meta.dimension}, found {library.row_count(index):,} of "
                                              f"{library.dimension(index)}")])
    params = dict(meta.params)
    for name, value in (("nprobe", nprobe), ("ef_search", ef_search)):
        if value is not None:
            if value < 1:
                raise IndexSearchError(f"expected {name} >= 1, found {value}")
            if name not in params:
                raise IndexSearchError(f"{name} applies to {'ivf' if name == 'nprobe' else 'hnsw'} indexes; this "
                                       f"one is {meta.kind}")
            params[name] = value
    rows = TypeRows(source.config, source.checkpoint, source.version, entity_type, add_global=meta.add_global)
    return EmbeddingIndex(source, path, meta, index, rows, params)


def _missing(source: CheckpointVersion, entity_type: str, path: AnyPath) -> PbgioError:
    others = sorted(p.name for p in source.checkpoint.path.iterdir()
                    if (parsed := naming.parse_versioned_file(p.name)) and parsed[0] == "index"
                    and parsed[1] == entity_type)
    build = f"build it: pbgio index build CONFIG --type {entity_type}"
    if others:
        return MissingArtifactError(str(path), f"index of {entity_type!r} for checkpoint version {source.version} "
                                               f"(found {', '.join(others)}, built from another version: a stale "
                                               f"index is never used; {build})")
    return MissingArtifactError(str(path), f"index of {entity_type!r} for checkpoint version {source.version} "
                                           f"({build})")
