"""``pbgio index build``: a nearest-neighbour index over one entity type of a checkpoint version.

The rows are the type's embeddings as export writes them (every partition, in order; the global
embedding added when the config has one, unless ``add_global=False``). Building streams the
partitions a bounded chunk of rows at a time (:meth:`pbgio.index_file.TypeRows.chunks`,
``PBG_ROW_CHUNK_BYTES``): it holds one chunk, the training sample (IVF) and the index, never a
whole partition, and writes the index into its file piece by piece, never a second copy of it
(:func:`pbgio.index_file.write_index_file`). An IVF index reads the partitions three times (the
sampled rows to train its lists, then every row to size each list, then every row to add it:
:func:`pbgio.index.library.add_rows`); flat and HNSW indexes read them once. The file is
written atomically beside the version's other files (``index_{type}.{metric}.{kind}.v{version}.h5``:
one per metric and kind, so a cos index for neighbours and a dot one for predictions sit side by
side; building one again replaces it) and removed with them when the version is superseded.

Kind ``auto`` picks ``flat`` (exact) up to :data:`~pbgio.spec.index.FLAT_MAX_ROWS` rows
(``flat_max_rows``) and ``ivf`` above, unless the IVF index needs more than
:data:`~pbgio.spec.index.IVF_FLAT_SHARE` of its lists visited to reach recall@10
:data:`~pbgio.spec.index.RECALL_TARGET`, or never reaches it: then a flat one, exact and no slower
to search. An approximate index's recall is measured as it is built (:mod:`pbgio.index.recall`:
rows drawn at random as queries, among the training sample for IVF, by one more pass for HNSW;
their exact top 10 scored as the rows are added), its ``nprobe``/``ef_search`` doubled until the
target is reached (unless given), and the recall stored in its metadata (``recall_at_10``). Why FAISS
and IVF (``tools/bench_ann.py libraries``, 1M clustered rows of d100, 2 cores): FAISS IVF with
8-bit codes built in 15 s, 110 MB, recall@10 1.0 at 0.2–0.4 ms a query; the graphs (FAISS HNSW,
hnswlib, USearch) took 43–49 s and 390–670 MB for 0.93–0.9985 at 0.12–0.21 ms. At 10M rows a graph
would take at least ten times its 1M build and 4–7 GB beside the table (not measured); IVF built
in 4.9 minutes, a 1.0 GB index, recall@10 1.0 at 4 ms a query re-ranked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
from numpy.typing import NDArray

from pbgio.checkpoint import read_committed
from pbgio.config import ConfigSchema
from pbgio.errors import PbgioError
from pbgio.index import library, recall
from pbgio.index.recall import Tuning
from pbgio.index.search import DEFAULT_CANDIDATES
from pbgio.index_file import IndexMeta, TypeRows, write_index_file
from pbgio.layout import CheckpointVersion, Layout, open_checkpoint
from pbgio.progress import Progress
from pbgio.spec import naming
from pbgio.spec.index import FLAT_MAX_ROWS, IVF_FLAT_SHARE, KINDS, METRICS, RECALL_K, RECALL_TARGET, default_metric
from pbgio.storage import AnyPath

SAMPLE_SEED = 0


class IndexBuildError(PbgioError, ValueError):
    """An index that cannot be built as asked: an unknown or featurized type, a bad kind or metric."""


@dataclass(frozen=True)
class BuiltIndex:
    """What a build wrote: the file, its metadata, its size and the seconds it took; ``tuning``:
    the recall measured (for an approximate index, or for the IVF index ``auto`` gave up for a flat
    one), ``recall_seconds`` what measuring it cost."""

    path: AnyPath
    meta: IndexMeta
    bytes: int
    seconds: float
    tuning: Tuning | None = None
    recall_seconds: float = 0.0
    ivf_lists: int = 0
    """The lists of the IVF index ``auto`` measured and gave up for a flat one (0: none)."""

    def summary(self) -> str:
        """One line: the index, its file, size and build time, and the recall measured."""
        line = f"{self.meta.describe()}: {self.path} ({self.bytes / 2**20:,.1f} MiB) in {self.seconds:.1f} s"
        tuning = self.tuning
        if tuning is None:
            return line
        cost = f"measured in {self.recall_seconds:.1f} s"
        if self.meta.kind == "flat":
            tried = f" ({tuning.steps()})" if tuning.tried else ""
            return (f"{line}; exact: an ivf index of {self.ivf_lists:,} lists needed more than "
                    f"{IVF_FLAT_SHARE:.0%} of them visited to reach recall@{RECALL_K} "
                    f"{RECALL_TARGET}{tried}, where a flat scan costs no more ({cost})")
        below = f", below the target {RECALL_TARGET}" if tuning.recall < RECALL_TARGET else ""
        return (f"{line}; recall@{RECALL_K} {tuning.recall:.3f}{below} on {tuning.queries:,} rows as queries, "
                f"{tuning.candidates:,} candidates ({tuning.steps()}; {cost})")


def build_index(
    config: Layout | ConfigSchema | str | AnyPath,
    entity_type: str,
    *,
    kind: str = "auto",
    metric: str | None = None,
    add_global: bool = True,
    flat_max_rows: int = FLAT_MAX_ROWS,
    nlist: int | None = None,
    nprobe: int | None = None,
    m: int | None = None,
    ef_search: int | None = None,
    version: int | None = None,
    checkpoint: str | AnyPath | None = None,
    base: str | AnyPath | None = None,
    progress: Progress | None = None,
) -> BuiltIndex:
    """Build and write the index of ``entity_type`` for ``version`` (default: the committed one).

    ``metric`` defaults to :func:`pbgio.spec.index.default_metric` of the config's comparator (as
    searches do); ``kind`` is ``auto`` (``flat`` up to ``flat_max_rows`` rows, else ``ivf`` or,
    where that is as costly, ``flat``), ``flat``, ``ivf`` or ``hnsw``; ``nlist``/``nprobe`` (ivf)
    and ``m``/``ef_search`` (hnsw) override the defaults of
    :func:`pbgio.index.library.default_params` (an ``nprobe``/``ef_search`` given is kept, not
    raised to reach the recall target). Needs FAISS (``pip install 'pbg[ann]'``).

    >>> import tempfile, pathlib
    >>> from pbgio.testing import small_valid_layout, write_layout
    >>> config = write_layout(pathlib.Path(tempfile.mkdtemp()), small_valid_layout(featurized=False))
    >>> built = build_index(config, "user")
    >>> built.path.name, built.meta.kind, built.meta.partition_rows
    ('index_user.cos.flat.v1.h5', 'flat', [5, 4])
    """
    source = open_checkpoint(config, base=base, checkpoint=checkpoint, version=version)
    cfg = source.config
    if entity_type not in cfg.entities:
        raise IndexBuildError(f"expected an entity type of the config {sorted(cfg.entities)}, found {entity_type!r}")
    if cfg.entities[entity_type].featurized:
        raise IndexBuildError(f"{entity_type!r} is featurized: its rows are features, not entities to search")
    metric = default_metric(cfg.comparator) if metric is None else metric
    if metric not in METRICS:
        raise IndexBuildError(f"expected a metric among {METRICS}, found {metric!r}")
    if kind not in ("auto", *KINDS):
        raise IndexBuildError(f"expected a kind among {('auto', *KINDS)}, found {kind!r}")
    for name, value in (("nlist", nlist), ("nprobe", nprobe), ("m", m), ("ef_search", ef_search),
                        ("flat_max_rows", flat_max_rows)):
        if value is not None and value < 1:
            raise IndexBuildError(f"expected {name} >= 1, found {value}")
    library.faiss_module()  # fail before reading anything when FAISS is missing
    overrides = {k: v for k, v in (("nlist", nlist), ("nprobe", nprobe), ("m", m), ("ef_search", ef_search))
                 if v is not None}
    return read_committed(source.checkpoint, lambda v: _build(
        source.at(v), entity_type, kind, metric, add_global, flat_max_rows,
        overrides, progress or Progress()), version)


def _build(source: CheckpointVersion, entity_type: str, kind: str, metric: str, add_global: bool,
           flat_max_rows: int, overrides: dict[str, int], progress: Progress) -> BuiltIndex:
    started = time.perf_counter()
    rows = TypeRows(source.config, source.checkpoint, source.version, entity_type, add_global=add_global)
    counts = rows.partition_rows()
    total = sum(counts)
    if total == 0:
        raise IndexBuildError(f"{entity_type!r} has no rows in checkpoint version {source.version}: nothing to index")
    auto = kind == "auto"
    if auto:
        kind = "flat" if total <= flat_max_rows else "ivf"
    defaults = library.default_params(kind, total)
    params = {**defaults, **{k: v for k, v in overrides.items() if k in defaults}}
    if kind == "ivf":
        params["nlist"] = min(params["nlist"], total)
        params["nprobe"] = min(params["nprobe"], params["nlist"])
    index = library.new_index(kind, rows.dimension, params)
    wanted = library.training_rows(kind, params, total)
    probe: tuple[NDArray[np.int64], NDArray[np.float32]] | None = None  # recall's queries: row ids, rows
    if wanted:
        chosen, sample = _sample(rows, counts, wanted, metric, progress, "to train on")
        progress.start(f"training {params['nlist']:,} lists on {len(sample):,} rows")
        library.train(index, sample)
        picked = np.sort(np.random.default_rng(SAMPLE_SEED + 1).choice(
            wanted, size=min(recall.RECALL_QUERIES, wanted), replace=False))
        probe = chosen[picked], sample[picked]
        del sample
    elif kind != "flat":
        probe = _sample(rows, counts, min(recall.RECALL_QUERIES, total), metric, progress, "as queries")
    exact = None if probe is None else recall.ExactTop(probe[1], probe[0])
    library.add_rows(index, kind, partial(_prepared_chunks, rows, metric, progress, exact))
    tuning, measured_lists = None, 0
    if exact is not None and probe is not None:
        progress.start(f"measuring recall@{RECALL_K} on {len(probe[0]):,} rows as queries")
        tuning = recall.tune(index, kind, params, probe[1], exact.truth(), DEFAULT_CANDIDATES,
                             fixed=tuning_param(kind) in overrides,
                             max_share=IVF_FLAT_SHARE if auto else None)
        if auto and not tuning.reached:  # as costly to search as a flat index, or never as good: flat
            kind, params, measured_lists = "flat", {}, params["nlist"]
            index = library.new_index(kind, rows.dimension, params)
            library.add_rows(index, kind, partial(_prepared_chunks, rows, metric, progress, None))
        else:
            params = {**params, tuning.param: tuning.value}
    progress.start("writing the index")
    meta = IndexMeta(entity_type=entity_type, version=source.version, metric=metric, add_global=rows.add_global,
                     dimension=rows.dimension, partition_rows=counts, fingerprint=rows.fingerprint(),
                     library=library.LIBRARY, library_version=library.library_version(), kind=kind, params=params)
    if tuning is not None and kind != "flat":
        meta = replace(meta, recall_at_10=round(tuning.recall, 4), recall_queries=tuning.queries,
                       recall_candidates=tuning.candidates)
    path = source.checkpoint.path / naming.index_file(entity_type, source.version, metric, kind)
    meta, size = write_index_file(path, meta, partial(library.write, index))
    progress.stop()
    recall_seconds = 0.0 if tuning is None or exact is None else tuning.seconds + exact.seconds
    return BuiltIndex(path, meta, size, time.perf_counter() - started, tuning, recall_seconds, measured_lists)


def tuning_param(kind: str) -> str:
    """The search parameter a build raises to reach the recall target."""
    return "nprobe" if kind == "ivf" else "ef_search"


def _prepared_chunks(rows: TypeRows, metric: str, progress: Progress, exact: recall.ExactTop | None,
                     what: str) -> Iterator[NDArray[np.float32]]:
    """Every row, prepared for the metric, a chunk at a time, in order (``what``: the pass, shown);
    the pass that adds them to the index also feeds them to ``exact``."""
    counts = rows.partition_rows()
    progress.start(f"{what}: {sum(counts):,} {rows.entity_type!r} rows", total=sum(counts))
    for part in range(len(counts)):
        for _, values in rows.chunks(part):
            prepared = library.prepare(values, metric)
            if exact is not None and what == library.ADDING:
                exact.add(prepared)
            yield prepared
            progress.advance(len(values))


def _sample(rows: TypeRows, counts: list[int], wanted: int, metric: str, progress: Progress,
            why: str) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """``wanted`` rows drawn uniformly without replacement across partitions (seeded), in order:
    their ids (row ``i`` of partition ``p``: ``i + start[p]``) and the rows, prepared for the metric
    a partition at a time; each partition's drawn rows are gathered from its chunks into their
    place in the sample (memory: the sample and one partition's drawn rows)."""
    chosen = np.sort(np.random.default_rng(SAMPLE_SEED).choice(sum(counts), size=wanted, replace=False))
    starts = np.concatenate([[0], np.cumsum(counts)])
    bounds = np.searchsorted(chosen, starts)  # each partition's drawn rows: chosen[bounds[p]:bounds[p + 1]]
    sample = np.empty((wanted, rows.dimension), np.float32)
    progress.start(f"sampling {wanted:,} rows {why}", total=len(counts))
    for part in range(len(counts)):
        lo, hi = bounds[part], bounds[part + 1]
        sample[lo:hi] = library.prepare(_gather(rows, part, chosen[lo:hi] - starts[part]), metric)
        progress.advance()
    return chosen.astype(np.int64), sample


def _gather(rows: TypeRows, part: int, offsets: NDArray[np.int64]) -> NDArray[np.float32]:
    """Rows ``offsets`` (sorted) of partition ``part``, picked from its chunks as they stream by."""
    out = np.empty((len(offsets), rows.dimension), np.float32)
    for first, values in rows.chunks(part):
        lo, hi = np.searchsorted(offsets, [first, first + len(values)])
        out[lo:hi] = values[offsets[lo:hi] - first]
    return out
