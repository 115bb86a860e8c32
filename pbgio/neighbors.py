"""Nearest neighbours of entities among the trained embeddings of their type: exact, cos or dot.

The vectors compared are those :func:`~pbgio.exporters.export_embeddings` writes: a row of the
checkpoint version (default: the committed one) with, when the config has ``global_emb``, the
type's global embedding added (``add_global=False`` compares the stored rows). No relation
operator is applied: this is similarity in the embedding space, not link prediction (for that,
``pbgtrain predict`` scores with the model's operator and comparator). A featurized type's
rows are its features, so its neighbours are features.

Every row of the type is compared with every query, exactly: partition by partition, a block
of rows at a time, each partition streamed a bounded chunk at a time (``PBG_ROW_CHUNK_BYTES``;
:class:`pbgio.index.RowWindow`; memory: a chunk or two, one block of scores and ``k`` per query,
never a partition; the queries' own rows are read alone), the best ``k`` kept by
:class:`~pbgio.topk.TopK` (equal scores: lower partition, then lower row first); the scan is
:func:`pbgio.topk.scan_partitions`, the one ``pbgtrain predict`` uses too.
``cos`` divides each vector by its L2 norm (a zero vector scores 0 against everything);
``dot`` is the plain inner product. On ``device="cpu"`` numpy does the products (no torch is
imported); ``cuda`` moves each block to the GPU through torch. A query is left out of its own
neighbours unless ``include_self``. The ``k`` neighbours found are scored once more one row at a
time on the CPU (:func:`pbgio.topk.scores_one_by_one`), as a search through an index scores
them, and ordered by that score: a row gets the same score, to the bit, either way. A
``candidate_filter`` (:class:`pbgio.candidates.CandidateFilter`: name prefixes, exact names)
keeps the rows whose names pass it: the scan scores those alone, and a search through an index
asks it for more rows until ``k`` pass (:meth:`pbgio.index.EmbeddingIndex.search`).

>>> import tempfile, pathlib
>>> from pbgio.testing import small_valid_layout, write_layout
>>> config = write_layout(pathlib.Path(tempfile.mkdtemp()), small_valid_layout(featurized=False))
>>> [found] = nearest_neighbors(config, "user", ["user-0-0"], k=3)
>>> found.candidates, len(found.neighbors), "user-0-0" in [n.name for n in found.neighbors]
(9, 3, False)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import NDArray

from pbgio.candidates import AdmittedRows, CandidateFilter
from pbgio.checkpoint import read_committed
from pbgio.checks.entities import names_count
from pbgio.config import ConfigSchema, entity_type_or_only
from pbgio.errors import FormatError, PbgioError
from pbgio.exporters.global_rows import add_global_embedding, global_embeddings
from pbgio.index.rows import RowWindow
from pbgio.layout import CheckpointVersion, Layout, open_checkpoint
from pbgio.names import Position, locate_entities, names_of
from pbgio.spec import naming
from pbgio.spec.index import default_metric
from pbgio.storage import AnyPath

if TYPE_CHECKING:
    from pbgio.index import EmbeddingIndex
    from pbgio.index.widening import Widened
from pbgio.topk import (
    METRICS,
    BlockScores,
    Metric,
    RankedEntity,
    VectorScorer,
    reordered,
    rows_per_block,
    scan_partitions,
    score_column,
    scores_one_by_one,
    text_table,
)

SCORE_BUDGET = 1 << 24
"""Elements of a block (its rows × max(dimension, queries)) scored at once: 64 MiB of float32."""
MAX_BLOCK_ROWS = 1 << 16
Floats = NDArray[np.float32]


class NeighborsError(PbgioError, ValueError):
    """The neighbours asked for cannot be computed: an unknown type, a bad k, metric or device."""


Neighbor = RankedEntity
"""One neighbour: its rank (from 1), name, score and place (partition, row offset)."""


@dataclass(frozen=True)
class Neighbors:
    """The nearest neighbours of one query entity, best first, among ``candidates`` rows."""

    query: str
    entity_type: str
    metric: str
    version: int
    candidates: int
    neighbors: list[Neighbor]
    searched: str = "exact"
    """``exact`` (every row scored), or the index that proposed the rows (then scored exactly)."""
    admitted: AdmittedRows | None = None
    """With a candidate filter: the rows it admits (``candidates`` counts those)."""
    widened: Widened | None = None
    """Through an index: how far it was asked (:meth:`pbgio.index.EmbeddingIndex.search`)."""

    def shortfall(self, k: int) -> str | None:
        """Why fewer than ``k`` neighbours passed the candidate filter through the index, or None."""
        if self.admitted is None or self.widened is None or self.widened.complete:
            return None
        return self.widened.shortfall(k, "neighbours")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (a non-finite score is null); with a candidate filter, ``candidate_filter``
        (and, through an index, ``index_search``: the rows asked for, proposed, passed)."""
        filtered: dict[str, Any] = {} if self.admitted is None else {"candidate_filter": self.admitted.to_dict()}
        if self.admitted is not None and self.widened is not None:
            filtered["index_search"] = self.widened.to_dict()
        return {"query": self.query, "entity_type": self.entity_type, "metric": self.metric,
                "version": self.version, "candidates": self.candidates, "searched": self.searched, **filtered,
                "neighbors": [n.to_dict() for n in self.neighbors]}


def format_neighbors(results: Sequence[Neighbors]) -> str:
    """One table (query, rank, name, score) for all the queries, the scores aligned
    (:func:`pbgio.topk.score_column`)."""
    found = [(r.query, n) for r in results for n in r.neighbors]
    scores = score_column([n.score for _, n in found])
    rows = [[query, str(n.rank), n.name, score] for (query, n), score in zip(found, scores, strict=True)]
    return text_table(["query", "rank", "name", "score"], rows, right=[1, 3])


def nearest_neighbors(
    config: Layout | ConfigSchema | str | AnyPath,
    entity_type: str | None,
    names: Sequence[str],
    *,
    k: int = 10,
    metric: Metric | None = None,
    include_self: bool = False,
    add_global: bool = True,
    device: str = "cpu",
    version: int | None = None,
    checkpoint: str | AnyPath | None = None,
    base: str | AnyPath | None = None,
    index: bool = False,
    nprobe: int | None = None,
    candidates: int | None = None,
    candidate_filter: CandidateFilter | None = None,
) -> list[Neighbors]:
    """The ``k`` nearest neighbours of each entity of ``names`` (of ``entity_type``; None: the
    config's only entity type), in order, by ``metric`` (None: the metric an index is built by
    unless told, :func:`pbgio.spec.index.default_metric` of the model's comparator).

    Names are looked up in the type's names files (an unknown one raises
    :class:`~pbgio.errors.UnknownNameError`); bad arguments raise :class:`NeighborsError`.
    Without ``version``, the committed version is read, all of it even while ``pbgtrain fit``
    commits newer ones (:func:`pbgio.checkpoint.read_committed`). With ``index``, an index of the
    version (:func:`pbgio.index.build_index`) by ``metric``, whose rows hold the global embedding
    as asked, proposes ``candidates`` rows per name and they are scored exactly
    (:func:`indexed_neighbors`); without one, :class:`pbgio.index.IndexMismatchError` lists the
    indexes there are. With ``candidate_filter``, only the entities whose names pass it are
    neighbours (none passing raises :class:`pbgio.candidates.NoCandidatesError`).
    """
    if k < 1:
        raise NeighborsError(f"expected k >= 1, found {k}")
    if metric is not None and metric not in METRICS:
        raise NeighborsError(f"expected a metric among {METRICS}, found {metric!r}")
    if isinstance(names, str):
        raise NeighborsError(f"expected a sequence of names, found the string {names!r} (write [{names!r}])")
    if not names:
        raise NeighborsError("expected at least one query name, found none")
    source = open_checkpoint(config, base=base, checkpoint=checkpoint, version=version)
    entity_type = entity_type_or_only(source.config, entity_type)
    if entity_type not in source.config.entities:
        raise NeighborsError(f"expected an entity type of the config {sorted(source.config.entities)}, "
                             f"found {entity_type!r}")
    scorer_device = _check_device(device)
    if metric is None:
        metric = cast(Metric, default_metric(source.config.comparator))
    if index:
        from pbgio.index.search import load_index

        with load_index(source, entity_type, metric=metric, add_global=add_global and source.config.global_emb,
                        nprobe=nprobe) as loaded:
            return indexed_neighbors(loaded, names, k=k, include_self=include_self, candidates=candidates,
                                     candidate_filter=candidate_filter)
    return read_committed(source.checkpoint, lambda v: _neighbors(
        replace(source, version=v), entity_type, list(names), k, metric, include_self, add_global, scorer_device,
        candidate_filter), version)


def indexed_neighbors(index: EmbeddingIndex, names: Sequence[str], *, k: int = 10, include_self: bool = False,
                      candidates: int | None = None,
                      candidate_filter: CandidateFilter | None = None) -> list[Neighbors]:
    """The ``k`` nearest neighbours of each of ``names`` through a loaded index (load it once with
    :func:`pbgio.index.open_index`, then ask as often as needed): the index proposes
    ``candidates`` rows per name, which are scored exactly by the index's metric. With
    ``candidate_filter``, the rows whose names pass it; the index is asked for more rows until
    ``k`` pass, or it has no more (:attr:`Neighbors.widened`, :meth:`Neighbors.shortfall`)."""
    if isinstance(names, str):
        raise NeighborsError(f"expected a sequence of names, found the string {names!r} (write [{names!r}])")
    source = index.source
    num_parts = source.config.num_partitions(index.entity_type)
    where = locate_entities(source.entity_path, index.entity_type, num_parts, names)
    queries = [where[name] for name in names]
    for q in queries:
        if q.offset >= index.meta.partition_rows[q.partition]:
            raise _more_names_than_rows(source, index.entity_type, q.partition, index.meta.partition_rows[q.partition])
    vectors = index.rows(np.array([q.partition for q in queries]), np.array([q.offset for q in queries]))
    admitted = None if candidate_filter is None else candidate_filter.rows(
        source.entity_path, index.entity_type, index.meta.partition_rows)
    found = index.search(vectors, k, candidates=candidates, admitted=admitted,
                         exclude=None if include_self else [(q.partition, q.offset) for q in queries])
    named = names_of(source.entity_path, index.entity_type,
                     [Position(p, o) for answer in found for _, p, o in answer.best])
    searched = index.describe(candidates)
    among = index.meta.rows if admitted is None else admitted.count
    return [Neighbors(name, index.entity_type, index.metric, index.version, among,
                      [Neighbor(rank, named[Position(p, o)], score, p, o)
                       for rank, (score, p, o) in enumerate(answer.best, 1)], searched, admitted, answer.widened)
            for name, answer in zip(names, found, strict=True)]


def _neighbors(source: CheckpointVersion, entity_type: str, names: list[str], k: int, metric: Metric,
               include_self: bool, add_global: bool, device: str,
               candidate_filter: CandidateFilter | None) -> list[Neighbors]:
    cfg = source.config
    num_parts = cfg.num_partitions(entity_type)
    where = locate_entities(source.entity_path, entity_type, num_parts, names)
    queries = [where[name] for name in names]
    shift = global_embeddings(source, [entity_type])[entity_type] if add_global and cfg.global_emb else None
    query_rows = _query_rows(source, entity_type, queries, shift)
    scorer = VectorScorer(query_rows, metric, device)
    admitted = None if candidate_filter is None else candidate_filter.rows(
        source.entity_path, entity_type,
        [source.checkpoint.embeddings_shape(entity_type, p, source.version)[0] for p in range(num_parts)])

    def open_partition(part: int) -> tuple[int, BlockScores]:
        num_rows = source.checkpoint.embeddings_shape(entity_type, part, source.version)[0]
        window = RowWindow((first, add_global_embedding(values, shift, entity_type)) for first, values in
                           source.checkpoint.iter_embedding_rows(entity_type, part, source.version))
        return num_rows, lambda start, stop: scorer(window(start, stop))

    step = rows_per_block(max(cfg.entity_dimension(entity_type), len(queries)), SCORE_BUDGET, MAX_BLOCK_ROWS)
    scan = scan_partitions(range(num_parts), open_partition, k=k if include_self else k + 1, block_rows=step,
                           queries=len(queries), admitted=None if admitted is None else admitted.by_partition())
    best = [[(s, p, o) for s, p, o in top.items() if include_self or Position(p, o) != q][:k]
            for top, q in zip(scan.tops, queries, strict=True)]
    found = _scored_one_by_one(source, entity_type, shift, metric, query_rows, best)
    named = names_of(source.entity_path, entity_type, [Position(p, o) for mine in found for _, p, o in mine])
    return [Neighbors(name, entity_type, metric, source.version, scan.candidates,
                      [Neighbor(rank, named[Position(p, o)], score, p, o)
                       for rank, (score, p, o) in enumerate(mine, 1)], admitted=admitted)
            for name, mine in zip(names, found, strict=True)]


Scored = list[tuple[float, int, int]]


def _scored_one_by_one(source: CheckpointVersion, entity_type: str, shift: Floats | None, metric: Metric,
                       query_rows: Floats, found: list[Scored]) -> list[Scored]:
    """Each query's rows ``found`` scored once more one by one (:func:`pbgio.topk.scores_one_by_one`,
    as :meth:`pbgio.index.EmbeddingIndex.search` scores what it returns) and ordered by that score;
    each partition's rows read once, alone."""
    wanted = sorted({(p, o) for mine in found for _, p, o in mine})
    rows: dict[tuple[int, int], Floats] = {}
    for part in sorted({p for p, _ in wanted}):
        offsets = np.array([o for p, o in wanted if p == part], np.int64)
        values = add_global_embedding(source.checkpoint.read_embedding_rows(entity_type, part, source.version,
                                                                            offsets), shift, entity_type)
        rows.update({(part, int(o)): values[i] for i, o in enumerate(offsets)})
    dimension = query_rows.shape[1]
    return [reordered(mine, scores_one_by_one(
        query, np.array([rows[(p, o)] for _, p, o in mine], np.float32).reshape(-1, dimension), metric).tolist())
            for query, mine in zip(query_rows, found, strict=True)]


def _query_rows(source: CheckpointVersion, entity_type: str, queries: list[Position], shift: Floats | None) -> Floats:
    """The rows of ``queries`` (global embedding added when ``shift`` is given), each partition's
    read without the rest of it."""
    vectors = np.empty((len(queries), source.config.entity_dimension(entity_type)), np.float32)
    for part in sorted({q.partition for q in queries}):
        members = [i for i, q in enumerate(queries) if q.partition == part]
        offsets = np.array([queries[i].offset for i in members], np.int64)
        num_rows = source.checkpoint.embeddings_shape(entity_type, part, source.version)[0]
        if offsets.max() >= num_rows:
            raise _more_names_than_rows(source, entity_type, part, num_rows)
        values = source.checkpoint.read_embedding_rows(entity_type, part, source.version, offsets)
        vectors[members] = add_global_embedding(values, shift, entity_type)
    return vectors


def _more_names_than_rows(source: CheckpointVersion, entity_type: str, part: int, rows: int) -> FormatError:
    path = source.entity_path / naming.entity_names_file(entity_type, part)
    embeddings = source.checkpoint.embeddings_path(entity_type, part, source.version)
    return FormatError(names_count(str(path), rows, None, f"the rows of {embeddings}"))  # type: ignore[arg-type]


def _check_device(device: str) -> str:
    if device == "cpu":
        return device
    if not device.startswith("cuda"):
        raise NeighborsError(f"expected device cpu, cuda or cuda:N, found {device!r}")
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError as exc:
        raise NeighborsError(f"expected device cpu, cuda or cuda:N, found {device!r} ({exc})") from None
    if not torch.cuda.is_available():
        raise NeighborsError(f"--device {device}: no CUDA device is usable here; use --device cpu")
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise NeighborsError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return device
