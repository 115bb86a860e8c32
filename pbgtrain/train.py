"""``pbgtrain fit``: the training loop.

For each iteration still to run (epoch → edge path → edge chunk, see
:class:`~pbgtrain.batching.IterationPlan`), the buckets are visited in ``bucket_order``; before
each bucket only the partitions that change are saved (into the version being built) and
loaded, so only the current bucket's partitions and the unpartitioned types are in memory;
within ``--partition-memory`` (by default a GPU's free memory, nothing on a CPU) swapped-out
partitions stay in memory until the commit instead, and the next bucket's edges (and, on a GPU,
partitions) are read ahead in the background (:mod:`pbgtrain.residency`).
The bucket's edge chunk is read through pbgio, ``eval_fraction`` of it is held out (evaluated
before and after training on the bucket), the rest is shuffled and batched (seed 004), and each
batch takes one :func:`~pbgtrain.model.train_step`. At the end of the iteration the version is
committed (:class:`~pbgtrain.checkpointing.TrainingCheckpoint`) and a line is appended to
``training_stats.json``. Parallelism: in each process, torch's intra-op threads (``workers``,
default the machine's cores split among its trainers) run the batched matrix products of a whole
batch at once, instead of the original's HOGWILD processes; several processes, on one machine or
many, train together as a distributed run (:mod:`pbgtrain.distributed`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pbgio import interrupts, storage
from pbgio.checkpoint import remove_superseded, remove_uncommitted
from pbgio.checks.config import schema_issue, semantic_issues
from pbgio.checks.edges import SideLimits, check_bounds, relation_limits
from pbgio.edges import EdgeBucket, bucket_length, read_bucket
from pbgio.entities import read_dynamic_rel_count, read_entity_count
from pbgio.errors import FormatError, Issue
from pbgio.spec import naming
from pbgio.spec.checkpoint import private_to_public
from pbgio.spec.edges import chunk_bounds
from pbgio.spec.stats import EXTRA_KEY
from pbgio.storage import AnyPath, LocalCache
from pbgtrain.batching import ChunkKey, IterationPlan, IterationStep, prepare_chunk, stable_seed
from pbgtrain.checkpointing import PartitionKey, TrainingCheckpoint, load_model_params, stored_param_shapes
from pbgtrain.config import RunConfig, default_device
from pbgtrain.evaluation import SIDES, EvalProtocol, RankingAccumulator, RankingMetrics
from pbgtrain.model import (
    MASKED_SCORE,
    BucketEdges,
    EmbeddingModel,
    EntityTable,
    StepStats,
    StepTotals,
    add_train_step,
    eval_step,
    fused,
    keep_freed_memory,
    release_freed_memory,
)
from pbgtrain.model.model import make_relation_optimizer
from pbgtrain.model.precision import Precision, check_precision, precision_scope
from pbgtrain.reporting import Reporter, make_reporter
from pbgtrain.residency import (
    GIB,
    PartitionCache,
    Prefetcher,
    default_budget,
    partition_bytes,
    pinned,
    table_bytes,
    to_device,
)
from pbgtrain.schedule import (
    Bucket,
    BucketScheduler,
    PartitionLayout,
    SingleMachineScheduler,
    Wait,
    all_buckets,
    plan_swap,
)

if TYPE_CHECKING:
    from pbgtrain.distributed.cluster import Cluster
    from pbgtrain.distributed.coordination import Coordination

EVAL_BATCH_SIZE_DEFAULT = 1000
PROGRESS_EVERY = 32
"""Batches between two reads of the running loss from the device (the progress bar's loss)."""


@dataclass(frozen=True)
class FitOptions:
    """How to run ``fit`` (everything else comes from the config)."""

    device: str | None = None
    seed: int = 0
    validate: bool = True
    interactive: bool = False
    max_seconds: float | None = None
    max_iterations: int | None = None
    rank: int | None = None  # --rank: this trainer's rank in a run of num_machines trainers
    peer_timeout: float | None = None  # seconds without a peer's heartbeat before a distributed run stops
    precision: str | None = None  # fp32, tf32 or bf16 (default: bf16 with half_precision, else fp32)
    partition_memory: float | None = None  # GiB of swapped-out partitions kept in memory (None: automatic)
    read_ahead_partitions: bool | None = None  # read the next bucket's partitions in the background (None: on a GPU)
    compile: bool = False  # fuse the step's elementwise passes with torch.compile (pbgtrain.model.fused)
    remote_cache: float = 8.0  # GiB of local copies of remote edge buckets (re-read every epoch)
    frozen_types: frozenset[str] = frozenset()  # --freeze: entity types whose embeddings stay as loaded


@dataclass
class IterationRecord:
    """What one committed iteration did."""

    version: int
    step: IterationStep
    seconds: float  # the iteration's wall time, its commit included (in a distributed run, its barriers too)
    train: StepStats
    eval_before: RankingMetrics | None = None
    eval_after: RankingMetrics | None = None

    @property
    def edges_per_second(self) -> float:
        return self.train.count / self.seconds if self.seconds > 0 else 0.0


@dataclass
class FitResult:
    start_version: int
    final_version: int
    total_iterations: int
    iterations: list[IterationRecord] = field(default_factory=list)
    stopped_early: bool = False
    movement: list[dict[str, Any]] = field(default_factory=list)  # per rank (rank 0's result; one entry alone)

    def summary(self) -> str:
        if not self.iterations:
            if self.final_version >= self.total_iterations:
                return f"nothing to do: checkpoint version {self.final_version} completes all " \
                       f"{self.total_iterations} iterations"
            return f"no iteration ran; checkpoint version {self.final_version}"
        edges = sum(r.train.count for r in self.iterations)
        seconds = sum(r.seconds for r in self.iterations)
        state = "stopped early at" if self.stopped_early else "committed"
        line = (f"trained {edges:,} edges in {seconds:.1f} s ({edges / max(seconds, 1e-9):,.0f} edges/s) over "
                f"{len(self.iterations)} iteration(s); {state} checkpoint version {self.final_version} of "
                f"{self.total_iterations}")
        last = self.iterations[-1].eval_after
        if last is not None:
            line += f"\nheld-out edges of the last iteration: {last}"
        return line


def _format_metrics(metrics: dict[str, float]) -> str:
    keys = [k for k in ("mrr", "r1", "r10", "auc", "loss") if k in metrics]
    return " ".join(f"{k} {metrics[k]:.4f}" for k in keys)


def add_negative_scores(acc: RankingAccumulator, scores: Any) -> None:
    """Rank each side's positives against its negatives; masked slots (self pairs, padding) excluded."""
    for side in SIDES:
        pos, neg = (scores.lhs_pos, scores.lhs_neg) if side == "lhs" else (scores.rhs_pos, scores.rhs_neg)
        if neg.shape[1]:
            acc.add(side, pos, neg, exclude=neg <= MASKED_SCORE)


def _merged(accumulators: list[RankingAccumulator]) -> RankingMetrics | None:
    if not accumulators:
        return None
    total = RankingAccumulator(accumulators[0].protocol)
    for acc in accumulators:
        total.merge(acc)
    return total.result()


def resolve_device(requested: str | None, run: RunConfig, cluster: Cluster | None = None) -> torch.device:
    """The device to run on: ``requested`` (``--device``), else the config's (``num_gpus``); a CUDA
    device that is not usable here is a one-line :class:`ConfigError`."""
    try:
        device = torch.device(requested or default_device(run.config))
    except RuntimeError as exc:
        raise _option_error(run, "--device", f"expected cpu, cuda or cuda:N, found {requested!r} ({exc})") from None
    if cluster is not None and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))  # one GPU per local trainer
    if device.type == "cuda":
        why = _cuda_unusable(device)
        if why:
            where = f"--device {requested}" if requested else f"num_gpus={run.config.num_gpus}"
            raise _option_error(run, where, f"{why}; train with --device cpu")
    return device


def _cuda_unusable(device: torch.device) -> str | None:
    """Why ``device`` cannot run CUDA kernels here (None when it can)."""
    if not torch.cuda.is_available():
        built = "this torch build has no CUDA support" if torch.version.cuda is None else \
            "no usable CUDA GPU is visible (driver, CUDA_VISIBLE_DEVICES)"
        return f"no CUDA device: {built}"
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"{device} does not exist: {count} CUDA device(s) are visible"
    return None


def resolve_precision(requested: str | None, run: RunConfig, device: torch.device) -> Precision:
    """``requested`` (``--precision``), else bf16 on a GPU when the config sets half_precision (on a
    CPU the original ignores it, and so does this), else fp32."""
    try:
        return check_precision(requested or ("bf16" if run.config.half_precision and device.type == "cuda"
                                             else "fp32"))
    except ValueError as exc:
        raise _option_error(run, "--precision", str(exc)) from None


def bucket_limits(cfg: Any, counts: dict[PartitionKey, int], bucket: Bucket,
                  num_dynamic_rels: int | None) -> dict[str, SideLimits]:
    """The limits of a bucket's ids (``check_bounds``'s ``lhs`` and ``rhs``), from the entity counts."""
    num_relations = len(cfg.relations) if num_dynamic_rels is None else num_dynamic_rels
    lhs = relation_limits(cfg, "lhs", bucket.lhs, num_relations, counts)
    rhs = relation_limits(cfg, "rhs", bucket.rhs, num_relations, counts)
    if lhs is None or rhs is None:  # a validated config names only its own types
        raise RuntimeError(f"no id limits for bucket {bucket}: a relation names a type the config lacks")
    return {"lhs": lhs, "rhs": rhs}


def remote_bucket_cache(options: FitOptions) -> LocalCache:
    """The bounded local store of remote edge buckets (``--remote-cache`` GiB)."""
    return LocalCache(int(options.remote_cache * GIB))


def frozen_types_problem(cfg: Any, frozen: frozenset[str] | set[str]) -> str | None:
    """Why ``--freeze`` of ``frozen`` cannot run with ``cfg`` (None when it can): a name that is
    not an entity type, or nothing left to train (every type the relations use is frozen, and
    no relation operator has parameters; the global embeddings of frozen types are frozen too).

    >>> from pbgio.example import example_config
    >>> cfg = example_config()
    >>> frozen_types_problem(cfg, {"item"}) is None and frozen_types_problem(cfg, {"user", "item"}) is None
    True
    >>> frozen_types_problem(cfg, {"users"})
    "unknown entity type 'users'; the config's entity types are 'item', 'user'"
    """
    unknown = sorted(set(frozen) - set(cfg.entities))
    if unknown:
        known = ", ".join(repr(t) for t in sorted(cfg.entities))
        names = ", ".join(repr(t) for t in unknown)
        return f"unknown entity type{'s' if len(unknown) > 1 else ''} {names}; the config's entity types are {known}"
    used = {t for r in cfg.relations for t in (r.lhs, r.rhs)}
    if not frozen or not used <= set(frozen):
        return None
    from pbgtrain.model.operators import make_dynamic_operator, make_operator

    def has_parameters(operator: str) -> bool:  # whatever the dimension (2: the smallest any operator takes)
        made = make_dynamic_operator(operator, 2, 1) if cfg.dynamic_relations else make_operator(operator, 2)
        return any(True for _ in made.parameters())

    if any(has_parameters(r.operator) for r in cfg.relations):
        return None
    return (f"every entity type of the relations is frozen ({', '.join(sorted(used))}) and no relation operator has "
            f"parameters (operator {', '.join(sorted({repr(r.operator) for r in cfg.relations}))}; global "
            "embeddings are frozen with their types): nothing would train; freeze fewer types")


def _option_error(run: RunConfig, where: str, message: str) -> FormatError:
    return FormatError(schema_issue(run.source, where, message))


def _validate_inputs(run: RunConfig, bucket_cache: LocalCache) -> None:
    """Refuse a layout that does not validate; remote buckets are read whole into ``bucket_cache``,
    where training then finds them."""
    from pbgio.validate import validate_config

    report = validate_config(run.config, base=run.base, source=run.source, cache=bucket_cache)
    errors = [i for i in report.issues if i.severity == "error"]
    if errors:
        shown = "\n".join(f"  {i.rule}: {i.file or ''} {i.dataset or ''}: {i.message}" for i in errors[:10])
        more = f"\n  … and {len(errors) - 10} more (run pbgio validate)" if len(errors) > 10 else ""
        raise FormatError(Issue(errors[0].rule, "error", run.source, None,
                                f"the layout does not validate ({len(errors)} error(s)); fix it before "
                                f"training:\n{shown}{more}"))


@dataclass
class MovementStats:
    """Partition traffic and waiting of one trainer (reported by the benchmark)."""

    bytes_saved: int = 0
    bytes_loaded: int = 0
    partitions_saved: int = 0
    partitions_loaded: int = 0
    seconds_waiting: float = 0.0  # asking for a bucket, and waiting for one
    seconds_swapping: float = 0.0  # saving and loading partitions between buckets (what reading ahead left)
    partitions_read_ahead: int = 0  # of partitions_loaded, those read in the background

    def add_table(self, table: EntityTable, saved: bool) -> None:
        size = table_bytes(table)
        if saved:
            self.bytes_saved += size
            self.partitions_saved += 1
        else:
            self.bytes_loaded += size
            self.partitions_loaded += 1


class Trainer:
    """Holds the state of one run: model, optimizer, resident partitions, checkpoint.

    With a :class:`~pbgtrain.distributed.cluster.Cluster` it is one trainer of many: buckets
    come from the lock server, partitions move through the checkpoint directory, and the
    shared state is kept in agreement (:mod:`pbgtrain.distributed`).
    """

    def __init__(self, run: RunConfig, options: FitOptions, cluster: Cluster | None = None,
                 bucket_cache: LocalCache | None = None) -> None:
        self.run = run
        self.cfg = cfg = run.config
        self.options = options
        self.cluster = cluster
        self.device = resolve_device(options.device, run, cluster)
        self.precision = resolve_precision(options.precision, run, self.device)
        self.counts = {(etype, part): read_entity_count(run.entity_path, etype, part)
                       for etype, entity in cfg.entities.items() for part in range(entity.num_partitions)}
        num_dynamic = read_dynamic_rel_count(run.entity_path) if cfg.dynamic_relations else None
        problem = frozen_types_problem(cfg, options.frozen_types)
        if problem is not None:
            raise _option_error(run, "--freeze", problem)
        self.frozen = frozenset(options.frozen_types)
        self.model = EmbeddingModel.from_config(cfg, num_dynamic, frozen=self.frozen).to(self.device)
        self.optimizer = make_relation_optimizer(self.model)
        self.ckpt = TrainingCheckpoint(run.checkpoint_path, cfg, init_path=run.init_path, seed=options.seed,
                                       device=self.device, counts=self.counts)
        self._restore_model()
        self.layout = PartitionLayout.from_config(cfg)
        self.resident: dict[PartitionKey, EntityTable] = {}
        self.generator = torch.Generator(device=self.device)
        self._bucket_lengths: dict[tuple[str, int, int], int] = {}
        self.movement = MovementStats()
        self.coordination: Coordination | None = None
        self.scheduler: BucketScheduler = SingleMachineScheduler.from_config(cfg, seed=options.seed)
        self.shared_update: Any = contextlib.nullcontext()  # held while a step updates the shared state
        # Single process: swapped-out partitions stay in memory within the budget, and the next
        # bucket is read ahead. A distributed run moves every partition through the checkpoint directory.
        budget = default_budget(self.device, self._bucket_bytes()) if options.partition_memory is None \
            else int(options.partition_memory * GIB)
        self.cache = PartitionCache(0 if cluster is not None else budget)
        self.prefetcher = Prefetcher() if cluster is None else None
        self.bucket_cache = bucket_cache or remote_bucket_cache(options)  # remote edge buckets only
        self.read_ahead_partitions = self.device.type == "cuda" if options.read_ahead_partitions is None \
            else options.read_ahead_partitions
        if cluster is not None:
            from pbgtrain.distributed.coordination import Coordination

            self.coordination = Coordination(cluster, self)
            self.scheduler = self.coordination.scheduler
            self.shared_update = self.coordination.sync.lock

    def _bucket_bytes(self) -> int:
        """Device bytes of the most a bucket holds: the largest partition of each type on each side,
        and the unpartitioned tables."""
        def largest(etype: str) -> int:
            return max(partition_bytes(count, self.cfg.entity_dimension(t)) for (t, _), count in self.counts.items()
                       if t == etype)

        sides = [*self.layout.lhs_types, *self.layout.rhs_types, *self.layout.unpartitioned]
        return sum(largest(etype) for etype in sides if any(t == etype for t, _ in self.counts))

    @property
    def num_buckets(self) -> int:
        lhs, rhs = self.cfg.bucket_grid()
        return lhs * rhs

    # ---- model state
    def _restore_model(self) -> None:
        """The model and its Adagrad state from the committed version, else from init_path (a warm
        start, as the original: parameters and optimizer state; dynamic operators of fewer relations
        grow), else from a v0 model file."""
        source = self.ckpt.model_source()
        if source is None:
            return
        directory, version = source
        state = directory.read_model(version)
        path = str(directory.model_path(version))
        grow = self.ckpt.may_grow(directory)
        load_model_params(self.model, state.params, path, grow=grow)
        if self.optimizer is not None:
            shapes = stored_param_shapes(self.model, self.optimizer, state.params) if grow else None
            self.ckpt.restore_optimizer(self.optimizer, state, path, self.model.spec.relation_lr, shapes)

    def model_params(self) -> dict[str, np.ndarray]:
        params = {}
        for key, value in self.model.state_dict().items():
            public = private_to_public(key)
            if public is None:
                raise RuntimeError(f"model state key {key!r} has no public checkpoint name")
            params[public] = value.detach().cpu().numpy()
        return params

    # ---- partitions
    def swap_to(self, bucket: Bucket | None, step: IterationStep) -> None:
        """Make exactly ``bucket``'s partitions resident (none for None), plus the unpartitioned
        types: evicted partitions are kept in memory while the cache's budget allows (until the
        commit writes them), else saved into the version being built, and handed back to the
        scheduler (another trainer may take them now); loads come from the cache, from what was
        read ahead, or from disk."""
        started = time.perf_counter()
        swap = plan_swap(self.resident, bucket, self.layout)
        for key in swap.evict:
            table = self.resident.pop(key)
            if key in self.ckpt.written or not self.cache.park(key, table):
                self.ckpt.save(key[0], key[1], table, step.info())
                self.movement.add_table(table, saved=True)
        self.scheduler.hand_back(swap.evict)
        if swap.evict and self.device.type == "cpu":
            release_freed_memory()  # the evicted tables' pages, before the next ones are read
        for key in swap.load:
            parked = self.cache.take(key)
            if parked is not None:
                self.resident[key] = parked
                continue
            ahead = self.prefetcher.take(("partition", step.index, key)) if self.prefetcher is not None else None
            loaded = to_device(ahead, self.device) if ahead is not None else \
                self.ckpt.load(key[0], key[1], self.counts[key])
            self.movement.add_table(loaded, saved=False)
            self.movement.partitions_read_ahead += ahead is not None
            self.resident[key] = loaded
        self.load_unpartitioned()
        self.movement.seconds_swapping += time.perf_counter() - started

    def read_ahead(self, step: IterationStep) -> None:
        """Start reading the next bucket of this pass in the background: its edges and, on a GPU,
        the partitions it will load from disk (those neither resident nor kept in memory). On a CPU
        partitions are not read ahead: that would hold a bucket's partitions twice, and the
        original's bound on memory (the current bucket's partitions) is what users partition for."""
        if self.prefetcher is None or not isinstance(self.scheduler, SingleMachineScheduler):
            return
        upcoming = self.scheduler.upcoming()
        if upcoming is None:
            return
        for key in plan_swap(self.resident, upcoming, self.layout).load if self.read_ahead_partitions else ():
            if key not in self.cache:
                self.prefetcher.submit(("partition", step.index, key), functools.partial(self._read_partition, key))
        self._chunk_bucket_length(step, upcoming)  # cached here, on this thread, before the reader uses it
        self.prefetcher.submit(("edges", step.index, upcoming), functools.partial(self._read_edges, step, upcoming))

    def _read_partition(self, key: PartitionKey) -> EntityTable:
        """A partition read into host memory (page-locked when training on a GPU)."""
        return pinned(self.ckpt.load(key[0], key[1], self.counts[key], device="cpu"), self.device)

    def load_unpartitioned(self) -> None:
        for key in self.layout.always_resident():
            if key not in self.resident and key in self.counts:
                self.resident[key] = self.ckpt.load(key[0], key[1], self.counts[key])

    def table(self, entity_type: str, bucket: Bucket, side: str) -> EntityTable:
        return self.resident[(entity_type, self.layout.partition_of(entity_type, bucket, side))]

    # ---- one bucket
    def train_bucket(self, step: IterationStep, bucket: Bucket, reporter: Reporter) -> tuple[StepStats, Any, Any]:
        cfg = self.cfg
        edges_np = self.prefetcher.take(("edges", step.index, bucket)) if self.prefetcher is not None else None
        if edges_np is None:
            edges_np = self._read_edges(step, bucket)
        edges = BucketEdges.from_bucket(edges_np, self.device, str(self._bucket_path(step, bucket)))
        key = ChunkKey(step.edge_path, step.edge_chunk_idx, bucket.lhs, bucket.rhs)
        if self.rank > 0 and step.epoch_idx == 0 and cfg.hogwild_delay > 0:
            time.sleep(cfg.hogwild_delay)  # as the original: trainers other than rank 0 start late in epoch 0
        prepared = prepare_chunk(edges_np.rel, key=key, eval_fraction=cfg.eval_fraction, batch_size=cfg.batch_size,
                                 dynamic=cfg.dynamic_relations,
                                 shuffle_seed=key.shuffle_seed(self.options.seed, step.epoch_idx))
        self.generator.manual_seed(stable_seed("negatives", self.options.seed, step.index, bucket.lhs, bucket.rhs))
        held = prepared.held_out.eval_idx.to(self.device)
        before = self.evaluate(held, edges, bucket) if len(held) else None
        with precision_scope(self.precision, self.device):
            stats = self._train_batches(prepared, edges, bucket, reporter)
        after = self.evaluate(held, edges, bucket) if len(held) else None
        return stats, before, after

    def _train_batches(self, prepared: Any, edges: BucketEdges, bucket: Bucket, reporter: Reporter) -> StepStats:
        """One step per batch of the chunk; the sums stay on the device, read back every
        :data:`PROGRESS_EVERY` batches (the progress bar's loss) and at the end."""
        cfg = self.cfg
        totals = StepTotals()
        shown, loss_shown = StepStats(), 0.0
        for batches in prepared.worker_batches:
            for k, idx in enumerate(batches):
                idx = idx.to(self.device, non_blocking=True)
                rel_of: int | torch.Tensor = edges.rel[idx] if cfg.dynamic_relations else batches.relation(k) or 0
                relation = cfg.relations[0 if cfg.dynamic_relations else int(rel_of)]
                batch = edges.batch(idx, rel_of, *self.model.spec.featurized_sides(relation))
                with self.shared_update:
                    add_train_step(totals, self.model, self.table(relation.lhs, bucket, "lhs"),
                                   self.table(relation.rhs, bucket, "rhs"), batch, self.optimizer,
                                   generator=self.generator)
                if totals.steps % PROGRESS_EVERY == 0:
                    now = totals.result()
                    loss_shown = (now.loss - shown.loss) / max(now.count - shown.count, 1)
                    shown = now
                reporter.edges_done(len(idx), loss_shown)
                interrupts.check()
        return totals.result()

    def _bucket_path(self, step: IterationStep, bucket: Bucket) -> AnyPath:
        return self.run.path(step.edge_path) / naming.bucket_file(bucket.lhs, bucket.rhs)

    def _read_edges(self, step: IterationStep, bucket: Bucket) -> EdgeBucket:
        """The chunk's edges, every id checked inside its table before anything is indexed with it
        (an out-of-range id would be a device-side assert on a GPU): a pbgio error naming file and row.
        Runs on the read-ahead thread too: it reads only what no bucket changes."""
        path = self._bucket_path(step, bucket)
        with storage.relocated(self.bucket_cache, path) as local:
            edges = read_bucket(local, chunk=(step.edge_chunk_idx, step.num_edge_chunks))
        first_row, _ = chunk_bounds(self._chunk_bucket_length(step, bucket), step.num_edge_chunks, step.edge_chunk_idx)
        check_bounds(edges, path, first_row=first_row,
                     **bucket_limits(self.cfg, self.counts, bucket, self.model.spec.num_dynamic_rels))
        return edges

    def eval_protocol(self) -> EvalProtocol:
        neg = self.model.spec.eval_negatives  # a chunk of batch negatives never exceeds a batch
        return EvalProtocol.sampled(min(neg.num_batch_negs, self.cfg.batch_size), neg.num_uniform_negs)

    @torch.no_grad()
    def evaluate(self, idx: torch.Tensor, edges: BucketEdges, bucket: Bucket) -> RankingAccumulator:
        """Held-out edges ranked against the eval negatives (eval_num_batch_negs + eval_num_uniform_negs)."""
        cfg = self.cfg
        acc = RankingAccumulator(self.eval_protocol(), seed=stable_seed("auc", self.options.seed, bucket.lhs,
                                                                         bucket.rhs))
        batch_size = cfg.batch_size
        groups = [(0, idx)] if cfg.dynamic_relations else [
            (r, idx[edges.rel[idx] == r]) for r in range(len(cfg.relations))]
        for r, sel in groups:
            relation = cfg.relations[r]
            for start in range(0, len(sel), batch_size):
                part = sel[start:start + batch_size]
                rel_of: int | torch.Tensor = edges.rel[part] if cfg.dynamic_relations else r
                batch = edges.batch(part, rel_of, *self.model.spec.featurized_sides(relation))
                result = eval_step(self.model, self.table(relation.lhs, bucket, "lhs"),
                                   self.table(relation.rhs, bucket, "rhs"), batch, generator=self.generator)
                add_negative_scores(acc, result.scores)
                acc.add_loss(result.loss, result.count)
        return acc

    # ---- one iteration
    def buckets_of_pass(self, step: IterationStep) -> Any:
        """Yield ``(bucket, position)`` as the scheduler grants them; while it says WAIT, hold nothing."""
        self.scheduler.new_pass(step.index)
        delay = 0.01
        while True:
            asked = time.perf_counter()
            granted = self.scheduler.acquire()
            self.movement.seconds_waiting += time.perf_counter() - asked
            if isinstance(granted, Wait):
                self.swap_to(None, step)  # save and hand back what we hold, so nobody waits for us
                if self.cluster is not None:
                    self.cluster.check()
                slept = time.perf_counter()
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
                self.movement.seconds_waiting += time.perf_counter() - slept
                continue
            delay = 0.01
            if granted is None:
                return
            yield granted, self.scheduler.position
            self.scheduler.release(granted)

    def run_iteration(self, step: IterationStep, reporter: Reporter) -> IterationRecord:
        started = time.perf_counter()
        stats = StepStats()
        before_all: list[Any] = []
        after_all: list[Any] = []
        records = []
        total_edges = sum(self._chunk_length(step, b) for b in all_buckets(*self.cfg.bucket_grid()))
        reporter.iteration_started(str(step), self.num_buckets, total_edges)
        if self.coordination is not None:
            self.coordination.iteration_started()
        for bucket, position in self.buckets_of_pass(step):
            self.swap_to(bucket, step)
            self.read_ahead(step)
            bucket_started, wall_started = time.perf_counter(), time.time()
            bucket_stats, before, after = self.train_bucket(step, bucket, reporter)
            stats = stats + bucket_stats
            if before is not None:
                before_all.append(before)
                after_all.append(after)
            record = self._stats_record(step, step.index * self.num_buckets + position, bucket, bucket_stats,
                                        before, after)
            record[EXTRA_KEY] = {**record.get(EXTRA_KEY, {}), "rank": self.rank, "trained_from": wall_started,
                                 "trained_until": time.time()}
            if self.frozen:  # the checkpoint does not record --freeze; the learning curve does
                record[EXTRA_KEY]["frozen_types"] = sorted(self.frozen)
            records.append(record)
            reporter.bucket_done(f"  bucket {bucket}: {bucket_stats.count:,} edges in "
                                 f"{time.perf_counter() - bucket_started:.2f} s, loss "
                                 f"{bucket_stats.loss / max(bucket_stats.count, 1):.4g}"
                                 + (f", eval {_format_metrics(after.result().values())}" if after is not None
                                    else ""))
        self.swap_to(None, step)
        if self.prefetcher is not None:
            self.prefetcher.discard()  # nothing read ahead outlives its pass
        snapshot = None
        interval = self.cfg.checkpoint_preservation_interval
        last_of_epoch = (step.edge_path_idx == step.num_edge_paths - 1
                         and step.edge_chunk_idx == step.num_edge_chunks - 1)
        if interval and last_of_epoch and (step.epoch_idx + 1) % interval == 0:
            snapshot = step.epoch_idx + 1  # epoch_{k}/ holds the state after k epochs, as in the original
        if self.coordination is not None:
            version, stats = self.coordination.commit(step, records, stats, snapshot)
            return IterationRecord(version, step, time.perf_counter() - started, stats)
        chunk_before = _merged(before_all)
        if chunk_before is not None:  # the original's per-iteration average of the held-out edges
            records.append({**_iteration_keys(step), "index": (step.index + 1) * self.num_buckets - 1,
                            "eval_stats_chunk_avg": chunk_before.to_stats()})
        # Stats first, then the commit, as the original orders them: a crash in between repeats the
        # iteration's lines when it is trained again, but never loses those of a committed version.
        self.ckpt.dir.append_stats(records)
        version = self.ckpt.commit([*self.resident.items(), *self.cache.items()], self.counts.keys(),
                                   self.model_params(),
                                   self.optimizer_state(), step.info(), snapshot_epoch=snapshot)
        return IterationRecord(version, step, time.perf_counter() - started, stats, chunk_before, _merged(after_all))

    def close(self) -> None:
        """Stop reading ahead (the background thread ends)."""
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.bucket_cache.close()

    @property
    def rank(self) -> int:
        return 0 if self.cluster is None else self.cluster.rank

    def optimizer_state(self) -> dict[str, Any] | None:
        return self.optimizer.state_dict() if self.optimizer is not None else None

    def _chunk_length(self, step: IterationStep, bucket: Bucket) -> int:
        """Edges of the bucket's chunk in this iteration."""
        start, end = chunk_bounds(self._chunk_bucket_length(step, bucket), step.num_edge_chunks, step.edge_chunk_idx)
        return end - start

    def _chunk_bucket_length(self, step: IterationStep, bucket: Bucket) -> int:
        """Edges of the whole bucket file (lengths read once per edge path)."""
        key = (step.edge_path, bucket.lhs, bucket.rhs)
        if key not in self._bucket_lengths:
            path = self.run.path(step.edge_path) / naming.bucket_file(bucket.lhs, bucket.rhs)
            with storage.relocated(self.bucket_cache, path) as local:
                self._bucket_lengths[key] = bucket_length(local)
        return self._bucket_lengths[key]

    @staticmethod
    def _stats_record(step: IterationStep, index: int, bucket: Bucket, stats: StepStats, before: Any,
                      after: Any) -> dict[str, Any]:
        """A bucket's line of training_stats.json, as the original writes it (pbgio.spec.stats);
        pbgtrain's own facts go under the sibling key ``pbgtrain``, which the original ignores."""
        count = max(stats.count, 1)
        record: dict[str, Any] = {
            "lhs_partition": bucket.lhs, "rhs_partition": bucket.rhs, "index": index,
            "stats": {"count": stats.count, "metrics": {
                "loss": stats.loss / count, "reg": stats.reg / count,
                "violators_lhs": stats.violators_lhs / count, "violators_rhs": stats.violators_rhs / count}},
        }
        if before is not None:
            results = {"before": before.result(), "after": after.result()}
            for when, result in results.items():
                record[f"eval_stats_{when}"] = result.to_stats()
            record[EXTRA_KEY] = {"eval_protocol": results["before"].protocol.describe(),
                                 **{f"eval_per_side_{when}": result.per_side_stats()
                                    for when, result in results.items()}}
        return {**record, **_iteration_keys(step)}


def _iteration_keys(step: IterationStep) -> dict[str, int]:
    return {"epoch_idx": step.epoch_idx, "edge_path_idx": step.edge_path_idx, "edge_chunk_idx": step.edge_chunk_idx}


def fit(run: RunConfig, options: FitOptions | None = None) -> FitResult:
    """Train ``run`` from its latest committed checkpoint to the end of the plan (or ``max_seconds``).

    When this process is one trainer of a distributed run (torchrun's environment, or
    ``options.rank`` with ``num_machines`` > 1) it joins the others first; see
    :mod:`pbgtrain.distributed`.
    """
    from pbgtrain.distributed.cluster import resolve_launch

    options = options or FitOptions()
    launch = resolve_launch(num_machines=run.config.num_machines, init_method=run.config.distributed_init_method,
                            rank=options.rank, env=os.environ)
    if launch is None:
        return _fit(run, options, None)
    from pbgtrain.distributed.cluster import PEER_TIMEOUT_DEFAULT, Cluster

    with Cluster(launch, peer_timeout=options.peer_timeout or PEER_TIMEOUT_DEFAULT) as cluster, \
            cluster.translating_interrupts():
        result = _fit(run, options, cluster)
        cluster.leave()
        return result


def default_threads(cfg: Any, local_trainers: int = 1) -> int:
    """``workers``, else the cores split evenly among the trainers on this machine.

    >>> from types import SimpleNamespace
    >>> default_threads(SimpleNamespace(workers=3), 4), default_threads(SimpleNamespace(workers=None), 10**6)
    (3, 1)
    """
    if cfg.workers:
        return int(cfg.workers)
    return max((os.cpu_count() or 1) // max(local_trainers, 1), 1)


def _fit(run: RunConfig, options: FitOptions, cluster: Cluster | None) -> FitResult:
    """The run, its checkpoint directory locked by rank 0 (the single process) from before anything
    is written to the end (:mod:`pbgio.storage.lock`): a second run on it is refused at once."""
    rank = 0 if cluster is None else cluster.rank
    if rank != 0:
        return _fit_locked(run, options, cluster, rank, None)
    from pbgio.storage.lock import CheckpointLock

    problem = storage.link_problem(run.checkpoint_path)
    if problem is not None:  # the lock would fail to create the directory (EEXIST)
        from pbgio.checks.layout import path_missing
        from pbgio.errors import ConfigError

        raise ConfigError(run.source, [path_missing(
            storage.display(run.checkpoint_path),
            f"expected the checkpoint_path directory (or nothing, before training), found {problem}",
            "checkpoint_path")])
    with CheckpointLock(run.checkpoint_path, command="pbgtrain fit") as lock:
        return _fit_locked(run, options, cluster, rank, lock.check)


def _fit_locked(run: RunConfig, options: FitOptions, cluster: Cluster | None, rank: int,
                check_lock: Callable[[], None] | None) -> FitResult:
    cfg = run.config
    torch.set_num_threads(default_threads(cfg, 1 if cluster is None else cluster.local_world_size))
    keep_freed_memory()
    # a wrong --device, --precision or --freeze fails before validation
    resolve_precision(options.precision, run, resolve_device(options.device, run, cluster))
    problem = frozen_types_problem(cfg, options.frozen_types)
    if problem is not None:
        raise _option_error(run, "--freeze", problem)
    bucket_cache = remote_bucket_cache(options)
    try:
        if options.validate and rank == 0:
            _validate_inputs(run, bucket_cache)
        first_bucket_sizes = [bucket_length(run.path(p) / naming.bucket_file(0, 0)) for p in cfg.edge_paths] \
            if cfg.num_edge_chunks is None else []
        plan = IterationPlan.from_config(cfg, first_bucket_sizes)
        if cluster is not None:
            cluster.barrier("validated")
        fused.use_compiled(options.compile)
        trainer = Trainer(run, options, cluster, bucket_cache)
    except BaseException:
        bucket_cache.close()
        raise
    try:
        with interrupts.noticed():
            return _train_plan(trainer, plan, rank, check_lock)
    finally:
        trainer.close()


def _train_plan(trainer: Trainer, plan: IterationPlan, rank: int,
                check_lock: Callable[[], None] | None = None) -> FitResult:
    options, cfg, cluster = trainer.options, trainer.cfg, trainer.cluster
    if rank == 0:
        remove_uncommitted(trainer.ckpt.dir)
        if trainer.ckpt.committed > 0:  # a run killed after its last commit point left the version before
            remove_superseded(trainer.ckpt.dir, trainer.ckpt.committed)
    if trainer.coordination is not None:
        trainer.coordination.run_started()
    start = trainer.ckpt.committed
    result = FitResult(start, start, len(plan))
    if start >= len(plan):
        return result
    started = time.perf_counter()
    reporter_of_rank = make_reporter(options.interactive and rank == 0, len(plan), start, cfg.verbose,
                                     prefix="" if cluster is None else f"[rank {rank}] ")
    with reporter_of_rank as reporter:
        if trainer.coordination is not None:
            reporter = trainer.coordination.run_wide(reporter)
        if cfg.background_io and rank == 0:
            reporter.log("warning: background_io is deprecated and has no effect (as in the original)")
        if trainer.frozen and rank == 0:
            reporter.log(f"frozen entity types (--freeze): {', '.join(sorted(trainer.frozen))}: their embeddings, "
                         "Adagrad state and global embeddings stay as loaded")
        for issue in semantic_issues(cfg) if rank == 0 else ():  # once per run: what runs differently
            if issue.severity == "warning":
                reporter.log(f"note [{issue.rule}]: {issue.dataset}: {issue.message}")
        for step in plan.steps(start):
            if check_lock is not None:
                check_lock()  # a remote lease lost to another writer stops the run before it commits
            record = trainer.run_iteration(step, reporter)
            result.iterations.append(record)
            result.final_version = record.version
            reporter.committed(
                f"{step}: {record.train.count:,} edges in {record.seconds:.1f} s "
                f"({record.edges_per_second:,.0f} edges/s), loss "
                f"{record.train.loss / max(record.train.count, 1):.4g}"
                + (f", held-out {_format_metrics(record.eval_after.values())}" if record.eval_after else "")
                + f" → version {record.version}")
            out_of_time = options.max_seconds is not None and time.perf_counter() - started > options.max_seconds
            out_of_iterations = options.max_iterations is not None and \
                len(result.iterations) >= options.max_iterations
            stop = (out_of_time or out_of_iterations) and record.version < len(plan)
            if trainer.coordination is not None:  # every rank stops after the same version: rank 0's call
                stop = trainer.coordination.agree_to_stop(record.version, stop)
            if stop:
                result.stopped_early = True
                break
    if trainer.coordination is not None:
        trainer.coordination.run_finished(result)
    else:
        result.movement = [{"rank": 0, **vars(trainer.movement), "partitions_kept_in_memory": trainer.cache.hits}]
    return result
