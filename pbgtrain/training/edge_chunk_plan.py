"""How many edge chunks a run trains with: ``num_edge_chunks``, one iteration (and one committed
version) per chunk of every bucket.

* **A resume keeps the checkpoint's count.** A checkpoint's versions count iterations: version N
  of a plan of K chunks an epoch (and edge path) stands for chunk N mod K; read with another K it
  would stand for another point of the plan, and chunks would be trained twice or never. The
  checkpoint's ``config.json`` records the K it was trained with (as the original writes it); a
  resume whose config gives another count takes the checkpoint's and says so
  (:func:`edge_chunk_plan`).
* **``--max-minutes`` makes an iteration short.** The time cap is asked after each commit, so a
  run ends within one iteration past it. A fresh single-process run given ``--max-minutes M``
  measures its training step on the edges of its largest bucket (:func:`measure_seconds_per_edge`:
  the run's step on tables of the run's sizes, drawn apart from the run's own, which it leaves as
  they are) and takes the fewest chunks, no fewer than the config's, that make an iteration's
  training take at most :data:`ITERATION_SHARE_OF_CAP` of the cap (:func:`chunks_for_time_cap`),
  and at most as many as leave a batch in every chunk of the largest bucket. The run is then the
  run of ``-p num_edge_chunks=K``, file for file: its checkpoint records K, and a resume keeps it.

Distributed runs keep the config's count (every trainer must agree on it before the first one
trains).
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from pbgio.checkpoint import CheckpointDir
from pbgio.checks.edges import check_bounds
from pbgio.edges import bucket_length, read_bucket
from pbgio.entities import read_dynamic_rel_count, read_entity_count
from pbgio.layout import Layout, stored_config
from pbgio.spec import naming
from pbgtrain.model import BucketEdges, EmbeddingModel, EntityTable
from pbgtrain.model.model import make_relation_optimizer
from pbgtrain.model.precision import precision_scope
from pbgtrain.model.runner import make_runner
from pbgtrain.schedule.batching import resolve_num_edge_chunks
from pbgtrain.schedule.buckets import Bucket, PartitionSides, all_buckets, bucket_limits
from pbgtrain.training.fit_plan import FitPlan

ITERATION_SHARE_OF_CAP = 0.1
"""Under ``--max-minutes``, an iteration's training takes at most this share of the cap (when a
batch per chunk allows it)."""

PROBE_BATCHES = 8
"""Batches of the largest bucket that :func:`measure_seconds_per_edge` times (after one to warm up)."""

PROBE_SECONDS = 2.0
"""... or fewer, once this many seconds have passed."""


def chunks_for_time_cap(configured: int, iteration_edges: int, largest_bucket: int, batch_size: int,
                        seconds_per_edge: float, cap_seconds: float) -> int:
    """The edge chunks that make an iteration of ``iteration_edges`` (an edge path's edges, all
    its buckets, with one chunk) at ``seconds_per_edge`` take at most :data:`ITERATION_SHARE_OF_CAP`
    of ``cap_seconds``: the fewest such, no fewer than ``configured``, and no more than leave a
    ``batch_size`` batch in a chunk of the ``largest_bucket`` (or ``configured``, when that is more).

    >>> chunks_for_time_cap(1, 542_048, 542_048, 1_000, 1 / 4_000, cap_seconds=14 * 60)  # 136 s an epoch
    2
    >>> chunks_for_time_cap(1, 542_048, 542_048, 1_000, 1 / 4_000, cap_seconds=60 * 60)  # within 6 minutes
    1
    >>> chunks_for_time_cap(1, 2_000, 2_000, 500, 1 / 4_000, cap_seconds=0)  # as many as keep a batch
    4
    >>> chunks_for_time_cap(3, 2_000, 2_000, 500, 1e-9, cap_seconds=60)  # never fewer than the config's
    3
    """
    most = max(configured, largest_bucket // batch_size)
    budget = ITERATION_SHARE_OF_CAP * cap_seconds
    needed = most if budget <= 0 else math.ceil(iteration_edges * seconds_per_edge / budget)
    return min(most, max(configured, needed))


def edge_chunk_plan(plan: FitPlan, device: torch.device, single_process: bool) -> FitPlan:
    """``plan`` with the edge chunks of the run (see the module doc): its layout's config gives
    them (``num_edge_chunks``) and ``plan.edge_chunks_note`` says why, when they are not the config's."""
    layout = plan.layout
    cfg = layout.config
    configured = _resolved(layout, cfg.num_edge_chunks, cfg.max_edges_per_chunk)
    checkpoint = CheckpointDir(layout.checkpoint_path)
    if checkpoint.read_version() > 0:
        stored = stored_config(checkpoint)
        kept = configured if stored is None else _resolved(layout, stored.num_edge_chunks, stored.max_edges_per_chunk)
        return plan if kept == configured else _with_chunks(
            plan, kept, f"edge chunks: {kept} per bucket, as the checkpoint's versions count them (the config gives "
                        f"{configured})")
    if plan.options.max_seconds is None or not single_process:
        return plan
    return _for_time_cap(plan, device, configured, plan.options.max_seconds)


def _for_time_cap(plan: FitPlan, device: torch.device, configured: int, cap_seconds: float) -> FitPlan:
    """``plan`` with the edge chunks :func:`chunks_for_time_cap` gives it, the step measured on its
    largest bucket (when more chunks than ``configured`` can be had)."""
    layout, cfg = plan.layout, plan.layout.config
    lengths = {(path, bucket): bucket_length(layout.path(path) / naming.bucket_file(bucket.lhs, bucket.rhs))
               for path in cfg.edge_paths for bucket in all_buckets(*cfg.bucket_grid())}
    (path, bucket), largest = max(lengths.items(), key=lambda item: item[1])
    if configured >= largest // cfg.batch_size:
        return plan  # no more chunks to choose from
    iteration_edges = max(sum(n for (p, _), n in lengths.items() if p == edge_path) for edge_path in cfg.edge_paths)
    seconds_per_edge = measure_seconds_per_edge(plan, device, path, bucket)
    if device.type == "cuda":  # the measure's tables handed back: the partition budget reads the free memory
        torch.cuda.empty_cache()
    chunks = chunks_for_time_cap(configured, iteration_edges, largest, cfg.batch_size, seconds_per_edge, cap_seconds)
    if chunks == configured:
        return plan
    expected = iteration_edges / chunks * seconds_per_edge
    cap = f"{ITERATION_SHARE_OF_CAP:g} × --max-minutes {cap_seconds / 60:g}"
    share = f"≤ {cap}" if expected <= ITERATION_SHARE_OF_CAP * cap_seconds else \
        f"more than {cap}, but a chunk holds a batch ({cfg.batch_size:,} edges) of the largest bucket"
    return _with_chunks(plan, chunks, (
        f"edge chunks: {chunks} per bucket, not the config's {configured}, so that the time cap ends the run within "
        f"an iteration: the step measured at {1 / seconds_per_edge:,.0f} edges/s trains an iteration of "
        f"{iteration_edges / chunks:,.0f} edges in ≈ {expected:.1f} s, {share} (the run of "
        f"-p num_edge_chunks={chunks})"))


def _resolved(layout: Layout, num_edge_chunks: int | None, max_edges_per_chunk: int) -> int:
    """``num_edge_chunks``, or the count ``max_edges_per_chunk`` gives the layout's first buckets."""
    first = [] if num_edge_chunks is not None else \
        [bucket_length(layout.path(p) / naming.bucket_file(0, 0)) for p in layout.config.edge_paths]
    return resolve_num_edge_chunks(num_edge_chunks, first, max_edges_per_chunk)


def _with_chunks(plan: FitPlan, chunks: int, note: str) -> FitPlan:
    config = plan.layout.config.model_copy(update={"num_edge_chunks": chunks})
    return dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, config=config), edge_chunks_note=note)


def measure_seconds_per_edge(plan: FitPlan, device: torch.device, edge_path: str, bucket: Bucket,
                             batches: int = PROBE_BATCHES, seconds: float = PROBE_SECONDS) -> float:
    """Seconds the run's training step takes per edge on ``device``, timed on the first batches of
    ``bucket`` of ``edge_path`` (one to warm up, then up to ``batches``, or ``seconds``): the step
    ``plan`` chose (eager: neither compiled nor replayed, which only speed it up), its precision,
    on tables of the bucket's partitions drawn for the measure alone. torch's global random state
    is left as it was: the run trains as it would without the measure."""
    layout, cfg = plan.layout, plan.layout.config
    file = layout.path(edge_path) / naming.bucket_file(bucket.lhs, bucket.rhs)
    num_dynamic = read_dynamic_rel_count(layout.entity_path) if cfg.dynamic_relations else None
    sides = PartitionSides.from_config(cfg)
    counts = {(etype, part): read_entity_count(layout.entity_path, etype, part)
              for etype, entity in cfg.entities.items() for part in range(entity.num_partitions)}
    read = read_bucket(file, edge_range=(0, min(bucket_length(file), (batches + 1) * cfg.batch_size)))
    check_bounds(read, file, first_row=0, **bucket_limits(cfg, counts, bucket, num_dynamic))
    edges = BucketEdges.from_bucket(read, device, str(file))
    relation = 0 if cfg.dynamic_relations else int(torch.bincount(edges.rel.cpu()).argmax())
    rows = torch.arange(len(edges), device=device) if cfg.dynamic_relations else \
        (edges.rel == relation).nonzero().squeeze(1)
    work = list(torch.split(rows, cfg.batch_size))
    rel = cfg.relations[relation]
    cuda = [torch.cuda.current_device() if device.index is None else device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        model = EmbeddingModel.from_config(cfg, num_dynamic, frozen=plan.options.frozen_types,
                                           relation_prediction=plan.options.relation_prediction).to(device)
        generator = torch.Generator(device=device).manual_seed(0)
        tables: dict[tuple[str, int], EntityTable] = {}
        for etype, side in ((rel.lhs, "lhs"), (rel.rhs, "rhs")):
            key = (etype, sides.partition_of(etype, bucket, side))
            if key not in tables:
                tables[key] = EntityTable.random(counts[key], cfg.entity_dimension(etype), init_scale=cfg.init_scale,
                                                 generator=generator, device=device)
        lhs_table = tables[(rel.lhs, sides.partition_of(rel.lhs, bucket, "lhs"))]
        rhs_table = tables[(rel.rhs, sides.partition_of(rel.rhs, bucket, "rhs"))]
        runner = make_runner(dataclasses.replace(plan.step, compiled=False, capture="none"), model,
                             make_relation_optimizer(model), device, cfg.batch_size, generator=generator,
                             static_shapes=plan.options.static_shapes)

        def train(idx: torch.Tensor) -> None:
            runner.train(edges, idx, None if cfg.dynamic_relations else relation, lhs_table, rhs_table)

        with precision_scope(plan.precision, device):
            train(work[0])
            runner.totals.take()  # its work done (read back from the device)
            timed, started = 0, time.perf_counter()
            for idx in work[1:] or work[:1]:
                train(idx)
                timed += len(idx)
                if time.perf_counter() - started > seconds:
                    break
            runner.totals.take()
            elapsed = time.perf_counter() - started
    return max(elapsed, 1e-9) / max(timed, 1)
