"""Searching a built index: :func:`open_index` loads it once (after refusing a stale, renamed or
damaged file), and the :class:`EmbeddingIndex` it returns answers any number of searches. A
local index file is mapped, not read (:func:`pbgio.index_file.load_index_payload`): a search
reads the pages of the lists it visits, so memory holds a few of them, not the index.

A search asks the index for ``candidates`` rows per query (its approximate order), then reads
those rows from the checkpoint and scores them exactly (:class:`pbgio.topk.VectorScorer`, the
scorer of the exact scan), so every score returned is exact and equal scores rank by
(partition, row) as in the exact scan; the ``k`` rows returned are scored once more one by one
(:func:`pbgio.topk.scores_one_by_one`), as the exact search scores the rows it returns, so a
row gets the same score, to the bit, through the index and without it. What an index can miss
is a row it never proposes; ``candidates`` (default :data:`DEFAULT_CANDIDATES`) and the kind's
``nprobe``/``ef_search`` trade that against time. With a candidate filter
(:class:`pbgio.candidates.AdmittedRows`), only the rows it admits are kept, and the index is
asked for more rows until ``k`` pass (:func:`pbgio.index.widening.widened_proposals`).

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

from pbgio.candidates import AdmittedRows
from pbgio.checks import index as checks
from pbgio.checks import raise_first
from pbgio.config import ConfigSchema
from pbgio.errors import FormatError, MissingArtifactError, PbgioError, StaleIndexError
from pbgio.index import library
from pbgio.index.widening import Passes, Widened, first_request, widened_proposals
from pbgio.index_file import IndexMeta, TypeRows, load_index_payload, read_index_meta, stale_issue
from pbgio.layout import CheckpointVersion, Layout, open_checkpoint
from pbgio.spec import naming
from pbgio.spec.index import SEARCH_ORDER
from pbgio.storage import AnyPath
from pbgio.topk import TopK, VectorScorer, reordered, scores_one_by_one

DEFAULT_CANDIDATES = 100
"""Rows per query the index proposes for exact re-ranking (at least ``k``)."""
QUERY_BLOCK = 256
"""Queries re-ranked together (their candidate rows are read once per partition)."""

Floats = NDArray[np.float32]
Scored = list[tuple[float, int, int]]


class IndexSearchError(PbgioError, ValueError):
    """A search the index cannot answer: a query of the wrong dimension, a bad k or candidates."""


@dataclasses.dataclass(frozen=True)
class IndexAnswer:
    """One query's answer: ``best`` ``(score, partition, offset)`` best first, and how far the
    index was asked (:class:`~pbgio.index.widening.Widened`: the rows it proposed, those that passed)."""

    best: Scored
    widened: Widened


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

    def describe(self, candidates: int | None = None) -> str:
        """Which index answered, and how: its file name, library, kind and search parameters, and
        whether its answer is exact or approximate (the recall measured at build:
        :meth:`~pbgio.index_file.IndexMeta.accuracy`; ``candidates``: the rows a search asked
        the index to propose, None for the default)."""
        return f"{self.path.name}, {self.meta.searched(self.params)}, {self.meta.accuracy(self.params, candidates)}"

    def __enter__(self) -> EmbeddingIndex:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Free the index (its memory, or its map of the file); later searches fail."""
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
        total = int(self._starts[-1])
        if ids.size and int(ids.max()) >= total:  # an id stored in a list that names no row: a tampered payload
            raise FormatError(checks.unloadable(
                str(self.path), f"expected row ids below the index's {total:,} rows, found {int(ids.max()):,} "
                                "among the ids its lists store; rebuild it with pbgio index build"))
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
              exclude: Sequence[tuple[int, int] | None] | None = None,
              admitted: AdmittedRows | None = None) -> list[Scored]:
        """The best ``k`` rows of each query by exact score: ``(score, partition, offset)`` best
        first. ``exclude[i]``: a position left out of query ``i``'s answer (the query itself);
        ``admitted``: the only rows an answer may hold (a candidate filter; see :meth:`search`)."""
        return [answer.best for answer in self.search(queries, k, candidates=candidates, exclude=exclude,
                                                      admitted=admitted)]

    def search(self, queries: Floats, k: int = 10, *, candidates: int | None = None,
               exclude: Sequence[tuple[int, int] | None] | None = None,
               admitted: AdmittedRows | None = None) -> list[IndexAnswer]:
        """:meth:`top_k`, with how far the index was asked for each query. The index is asked for
        ``candidates`` rows (at least ``k`` + 1), divided by the share of rows ``admitted`` lets
        through; while fewer than ``k`` of a query's proposals pass (``admitted`` and not
        ``exclude``), for :data:`~pbgio.index.widening.GROWTH` times more, up to all its rows
        (:func:`~pbgio.index.widening.widened_proposals`); :attr:`IndexAnswer.widened` says when
        fewer than ``k`` passed."""
        if k < 1:
            raise IndexSearchError(f"expected k >= 1, found {k}")
        count = max(k + 1, DEFAULT_CANDIDATES if candidates is None else candidates)
        if candidates is not None and candidates < k:
            raise IndexSearchError(f"expected candidates >= k ({k}), found {candidates}")
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        share = 1.0 if admitted is None else admitted.share
        results: list[IndexAnswer] = []
        for start in range(0, len(queries), QUERY_BLOCK):
            block = queries[start:start + QUERY_BLOCK]
            skips = None if exclude is None else exclude[start:start + QUERY_BLOCK]

            def passes(query: int, parts: NDArray[np.int64], offsets: NDArray[np.int64],
                       skips: Sequence[tuple[int, int] | None] | None = skips) -> NDArray[np.bool_]:
                keep = np.ones(len(parts), dtype=bool) if admitted is None else admitted.admits(parts, offsets)
                skip = None if skips is None else skips[query]
                return keep if skip is None else keep & ((parts != skip[0]) | (offsets != skip[1]))

            widened = self.propose_passing(block, passes, need=k, count=count, share=share)
            results += [IndexAnswer(best, found)
                        for best, found in zip(self._rerank(block, widened, k), widened, strict=True)]
        return results

    def propose_passing(self, queries: Floats, passes: Passes, *, need: int, count: int, share: float = 1.0,
                        extra: int = 0) -> list[Widened]:
        """Each query's proposals that ``passes`` keeps, in the index's order: asking first for
        ``count`` rows divided by ``share`` (the share of rows expected to pass; no more than the
        index holds, no fewer than ``count``), plus ``extra`` (rows known to be left out), then
        :data:`~pbgio.index.widening.GROWTH` times more while fewer than ``need`` pass, up to all
        its rows (:func:`~pbgio.index.widening.widened_proposals`)."""
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))

        def propose(which: NDArray[np.intp], n: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
            return self.propose(queries[which], n)

        start = max(count, min(first_request(count, share), self.meta.rows)) + extra
        return widened_proposals(propose, passes, len(queries), need=need, start=start, limit=self.meta.rows)

    def _rerank(self, queries: Floats, proposals: Sequence[Widened], k: int) -> list[Scored]:
        """Each query's best ``k`` of its proposals by exact score, those ``k`` scored once more one
        by one (:func:`~pbgio.topk.scores_one_by_one`) and ordered by that score."""
        if not any(p.passed for p in proposals):
            return [[] for _ in queries]
        ids = np.unique(np.concatenate([np.stack([p.partitions, p.offsets], axis=1) for p in proposals]), axis=0)
        rows = self.rows(ids[:, 0], ids[:, 1])
        scores = VectorScorer(queries, self.metric, "cpu")(rows)  # type: ignore[arg-type]
        key = ids[:, 0] * (int(self._starts[-1]) + 1) + ids[:, 1]
        out = []
        for i, mine in enumerate(proposals):
            where = np.searchsorted(key, mine.partitions * (int(self._starts[-1]) + 1) + mine.offsets)
            top = TopK(k)
            for part in np.unique(ids[where, 0]):
                chosen = where[ids[where, 0] == part]
                top.add(scores[i, chosen], int(part), ids[chosen, 1])
            best = top.items()
            at = np.searchsorted(key, np.array([p * (int(self._starts[-1]) + 1) + o for _, p, o in best], np.int64))
            exact = scores_one_by_one(queries[i], rows[at], self.metric)  # type: ignore[arg-type]
            out.append(reordered(best, exact.tolist()))
        return out


class IndexMismatchError(MissingArtifactError):
    """The version has indexes of the entity type, but none a search can take (another metric,
    kind, or global embedding): the message lists them (``found``) and says how to build one that
    fits (``build``)."""

    def __init__(self, path: str, wanted: str, found: Sequence[str], build: str) -> None:
        self.found = tuple(found)
        self.build = build
        super().__init__(path, f"{wanted} (found {'; '.join(found)}; build one: {build})")


def open_index(
    config: Layout | ConfigSchema | str | AnyPath,
    entity_type: str,
    *,
    metric: str | None = None,
    kind: str | None = None,
    version: int | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
    checkpoint: str | AnyPath | None = None,
    base: str | AnyPath | None = None,
) -> EmbeddingIndex:
    """Load an index of ``entity_type`` for ``version`` (default: the committed one): one by
    ``metric`` and of ``kind`` (None: any), the first kind of
    :data:`pbgio.spec.index.SEARCH_ORDER` when several fit (:func:`find_index`).

    Refused, never used: a missing index (:class:`~pbgio.errors.MissingArtifactError`, naming
    the index of another version when there is one; :class:`IndexMismatchError` when the version
    has indexes of the type but none by ``metric``/``kind``), a file that is not an index or whose
    metadata disagrees with its name (:class:`~pbgio.errors.FormatError`), an index whose tables
    changed (:class:`~pbgio.errors.StaleIndexError`), a damaged payload. ``nprobe``/``ef_search``
    override the defaults the index was built with.
    """
    source = open_checkpoint(config, base=base, checkpoint=checkpoint, version=version)
    return load_index(source, entity_type, metric=metric, kind=kind, nprobe=nprobe, ef_search=ef_search)


def index_files(source: CheckpointVersion, entity_type: str) -> list[tuple[AnyPath, naming.IndexName]]:
    """The index files of ``entity_type`` built from ``source``'s version, by name."""
    if not source.checkpoint.path.is_dir():
        return []
    found = []
    for path in source.checkpoint.path.iterdir():
        name = naming.parse_index_file(path.name)
        if name is not None and name.entity_type == entity_type and name.version == source.version:
            found.append((path, name))
    return sorted(found, key=lambda item: item[0].name)


def find_index(source: CheckpointVersion, entity_type: str, *, metric: str | None = None, kind: str | None = None,
               add_global: bool | None = None) -> AnyPath:
    """The index file a search takes: of those of ``entity_type`` at ``source``'s version whose
    metric is ``metric``, kind ``kind`` (None: any) and, given ``add_global``, whose rows hold the
    global embedding or not, the first kind of :data:`~pbgio.spec.index.SEARCH_ORDER` (a file
    with pbgio 0.1's name, ``index_{type}.v{version}.h5``, after one of today's). An index whose
    metadata cannot be read raises its error when its name fits the search, and fits nothing
    otherwise."""
    if not source.config.global_emb:
        add_global = None  # no index's rows hold a global embedding: nothing to tell them apart by
    found = index_files(source, entity_type)
    if not found:
        raise _missing(source, entity_type, build_command(source.config, entity_type, metric, kind, add_global))
    fitting: list[tuple[int, bool, str, AnyPath]] = []
    seen: list[str] = []
    for path, name in found:
        held_metric, held_kind, held_global = name.metric, name.kind, None
        if held_metric is None or held_kind is None or add_global is not None:
            try:
                meta = read_index_meta(path)
            except (FormatError, OSError):
                if name.metric is not None and metric in (None, name.metric) and kind in (None, name.kind):
                    raise  # its name fits the search: why it cannot be used is the answer
                seen.append(f"{path.name} (unreadable)")
                continue
            held_metric, held_kind, held_global = meta.metric, meta.kind, meta.add_global
        rows = "" if add_global is None else f", rows {'with' if held_global else 'without'} the global embedding"
        seen.append(f"{path.name} ({held_kind} by {held_metric}{rows})")
        if (metric in (None, held_metric) and kind in (None, held_kind)
                and (add_global is None or held_global == add_global)):
            order = SEARCH_ORDER.index(held_kind) if held_kind in SEARCH_ORDER else len(SEARCH_ORDER)
            fitting.append((order, name.metric is None, path.name, path))
    if not fitting:
        wanted = " ".join(part for part in (kind, metric) if part) or "usable"
        rows = "" if add_global is None else f" with rows {'with' if add_global else 'without'} the global embedding"
        raise IndexMismatchError(str(source.checkpoint.path),
                                 f"a {wanted} index of {entity_type!r}{rows} for checkpoint version {source.version}",
                                 seen, build_command(source.config, entity_type, metric, kind, add_global))
    return min(fitting)[-1]


def build_command(config: ConfigSchema, entity_type: str, metric: str | None, kind: str | None,
                  add_global: bool | None) -> str:
    """The ``pbgio index build`` that builds the index a search by ``metric`` of ``kind`` (None:
    any), whose rows hold the global embedding as ``add_global`` says (None: either), would take:
    ``--no-global`` only where the config has global embeddings and the search leaves them out."""
    return (f"pbgio index build CONFIG --type {entity_type}" + (f" --metric {metric}" if metric else "")
            + (f" --kind {kind}" if kind else "") + (" --no-global" if config.global_emb and add_global is False
                                                     else ""))


def load_index(source: CheckpointVersion, entity_type: str, *, metric: str | None = None, kind: str | None = None,
               add_global: bool | None = None, nprobe: int | None = None,
               ef_search: int | None = None) -> EmbeddingIndex:
    """:func:`open_index` for a checkpoint version already located (config, entity directory,
    checkpoint directory, version); ``add_global`` (None: either) picks an index whose rows hold
    the global embedding, or not."""
    path = find_index(source, entity_type, metric=metric, kind=kind, add_global=add_global)
    meta = read_index_meta(path)
    shown = str(path)
    name = naming.parse_index_file(path.name)
    assert name is not None  # find_index lists index names only
    types = {etype: e.featurized for etype, e in source.config.entities.items()}
    raise_first([checks.entity_type(shown, dataclasses.asdict(meta), types),
                 checks.name_mismatch(shown, name, dataclasses.asdict(meta))])
    raise_first([stale_issue(source.config, source.checkpoint, source.version, meta, shown)], StaleIndexError)
    try:
        index = load_index_payload(path, meta, library.view, library.read)
    except (RuntimeError, MemoryError) as exc:  # intact by its digest, yet not an index FAISS can read
        raise_first([checks.unloadable(shown, f"expected a {meta.library} index, found bytes it cannot read "
                                              f"({str(exc).strip().splitlines()[-1][:200]})")])
    if library.row_count(index) != meta.rows or library.dimension(index) != meta.dimension:
        raise_first([checks.unloadable(shown, f"expected an index of {meta.rows:,} rows of dimension "
                                              f"{meta.dimension}, found {library.row_count(index):,} of "
                                              f"{library.dimension(index)}")])
    params = dict(meta.params)
    for param, value in (("nprobe", nprobe), ("ef_search", ef_search)):
        if value is not None:
            if value < 1:
                raise IndexSearchError(f"expected {param} >= 1, found {value}")
            if param not in params:
                raise IndexSearchError(f"{param} applies to {'ivf' if param == 'nprobe' else 'hnsw'} indexes; this "
                                       f"one is {meta.kind}")
            params[param] = value
    rows = TypeRows(source.config, source.checkpoint, source.version, entity_type, add_global=meta.add_global)
    return EmbeddingIndex(source, path, meta, index, rows, params)


def _missing(source: CheckpointVersion, entity_type: str, command: str) -> PbgioError:
    others = sorted(p.name for p in source.checkpoint.path.iterdir()
                    if (parsed := naming.parse_index_file(p.name)) and parsed.entity_type == entity_type) \
        if source.checkpoint.path.is_dir() else []
    build = f"build it: {command}"
    where = str(source.checkpoint.path)
    if others:
        return MissingArtifactError(where, f"index of {entity_type!r} for checkpoint version {source.version} "
                                           f"(found {', '.join(others)}, built from another version: a stale "
                                           f"index is never used; {build})")
    return MissingArtifactError(where, f"index of {entity_type!r} for checkpoint version {source.version} ({build})")
