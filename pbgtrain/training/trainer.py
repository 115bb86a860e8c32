"""One trainer: the model, its partitions, one bucket, one iteration.

A :class:`Trainer` holds the state of a run in one process (model, optimizer, resident partitions,
checkpoint) and trains one iteration at a time (:meth:`Trainer.run_iteration`): the buckets are
visited as the scheduler grants them; before each bucket only the partitions that change are
saved (into the version being built) and loaded, so only the current bucket's partitions and the
unpartitioned types are in memory; within ``--partition-memory`` (by default a GPU's free memory,
nothing on a CPU) swapped-out partitions stay in memory until the commit instead, and the next
bucket's edges (and, on a GPU, partitions) are read ahead in the background
(:mod:`pbgtrain.training.residency`). The bucket's edge chunk is read through pbgio, ``eval_fraction`` of it
is held out (evaluated before and after training on the bucket), the rest is shuffled and batched
(seed 004), and each batch takes one :func:`~pbgtrain.model.train_step`. At the end of the
iteration its stats lines and the version are committed
(:func:`~pbgtrain.checkpointing.commit_iteration`).

Whether the trainer is alone or one of many is its :class:`~pbgtrain.training.coordinator.Coordinator`'s
business: the trainer asks it for the bucket scheduler and to commit, and never which kind it is.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import numpy as np
import torch

from pbgio import interrupts, storage
from pbgio.checks.edges import check_bounds
from pbgio.edges import EdgeBucket, bucket_length, read_bucket
from pbgio.entities import read_dynamic_rel_count, read_entity_count
from pbgio.spec import naming
from pbgio.spec.checkpoint import private_to_public
from pbgio.spec.edges import chunk_bounds
from pbgio.spec.stats import EXTRA_KEY
from pbgio.storage import AnyPath, LocalCache
from pbgtrain.checkpointing import (
    PartitionKey,
    StatsLine,
    TrainingCheckpoint,
    commit_iteration,
    load_model_params,
    stored_param_shapes,
)
from pbgtrain.config import RunConfig
from pbgtrain.metrics import SIDES, EvalProtocol, RankingAccumulator
from pbgtrain.model import (
    BucketEdges,
    EmbeddingModel,
    EntityTable,
    StepStats,
    StepTotals,
    add_train_step,
    eval_step,
    release_freed_memory,
)
from pbgtrain.model.model import make_relation_optimizer
from pbgtrain.model.precision import precision_scope
from pbgtrain.progress import Reporter
from pbgtrain.ranking import eval_ranks_every_entity, rank_all_entities
from pbgtrain.training.batching import ChunkKey, IterationStep, prepare_chunk, stable_seed
from pbgtrain.training.buckets import Bucket, PartitionLayout, Wait, all_buckets, bucket_limits, plan_swap
from pbgtrain.training.coordinator import Coordinator, LocalCoordinator, Outcome, TrainerHandle
from pbgtrain.training.device import option_error, resolve_device, resolve_precision
from pbgtrain.training.options import (
    TrainerOptions,
    frozen_types_problem,
    operator_init_problem,
    remote_bucket_cache,
)
from pbgtrain.training.records import (
    IterationRecord,
    MovementStats,
    add_negative_scores,
    format_metrics,
    held_out_metrics,
    stats_line,
)
from pbgtrain.training.residency import (
    GIB,
    PartitionCache,
    Prefetcher,
    default_budget,
    partition_bytes,
    pinned,
    to_device,
)

PROGRESS_EVERY = 32
"""Batches between two reads of the running loss from the device (the progress bar's loss)."""


class Trainer:
    """Holds the state of one run: model, optimizer, resident partitions, checkpoint.

    ``coordinator`` (default: a :class:`~pbgtrain.training.coordinator.LocalCoordinator`, a single
    process) is the run it belongs to: it hands out the buckets, commits, and says where this
    process sits (with a distributed one, buckets come from the lock server, partitions move
    through the checkpoint directory, and the shared state is kept in agreement).
    """

    def __init__(self, run: RunConfig, options: TrainerOptions, coordinator: Coordinator | None = None,
                 bucket_cache: LocalCache | None = None) -> None:
        self.run = run
        self.cfg = cfg = run.config
        self.options = options
        self.coordinator = coordinator = coordinator or LocalCoordinator()
        self.device = resolve_device(options.device, run, coordinator.device_index)
        self.precision = resolve_precision(options.precision, run, self.device)
        self.counts = {(etype, part): read_entity_count(run.entity_path, etype, part)
                       for etype, entity in cfg.entities.items() for part in range(entity.num_partitions)}
        num_dynamic = read_dynamic_rel_count(run.entity_path) if cfg.dynamic_relations else None
        problem = frozen_types_problem(cfg, options.frozen_types)
        if problem is not None:
            raise option_error(run, "--freeze", problem)
        self.frozen = frozenset(options.frozen_types)
        self.model = EmbeddingModel.from_config(cfg, num_dynamic, frozen=self.frozen)
        problem = operator_init_problem(options.operator_init)
        if problem is not None:
            raise option_error(run, "--operator-init", problem)
        if options.operator_init == "random":  # before _restore_model: what a checkpoint holds replaces it
            self.model.draw_operators(cfg.init_scale, stable_seed("operators", options.seed))
        self.model = self.model.to(self.device)
        self.optimizer = make_relation_optimizer(self.model)
        self.config_lrs = (self.model.spec.lr, self.model.spec.relation_lr)
        self.ckpt = TrainingCheckpoint(run.checkpoint_path, cfg, init_path=run.init_path, seed=options.seed,
                                       device=self.device, counts=self.counts, written=coordinator.written)
        self._restore_model()
        self.layout = PartitionLayout.from_config(cfg)
        self.resident: dict[PartitionKey, EntityTable] = {}
        self.generator = torch.Generator(device=self.device)
        self._bucket_lengths: dict[tuple[str, int, int], int] = {}
        self.movement = MovementStats()
        self.scheduler = coordinator.bucket_scheduler(cfg, self.layout, self.counts, options.seed)
        # Swapped-out partitions stay in memory within the budget when the coordinator allows it (a
        # single process; in a distributed run another trainer may need them at once).
        budget = default_budget(self.device, self._bucket_bytes()) if options.partition_memory is None \
            else int(options.partition_memory * GIB)
        self.cache = PartitionCache(budget if coordinator.keeps_partitions else 0)
        self.prefetcher = Prefetcher()  # reads ahead what the scheduler says comes next (its thread starts then)
        self.bucket_cache = bucket_cache or remote_bucket_cache(options)  # remote edge buckets only
        self.read_ahead_partitions = self.device.type == "cuda" if options.read_ahead_partitions is None \
            else options.read_ahead_partitions
        self.load_unpartitioned()  # part of the shared state, which the coordinator agrees on at the start

    def _bucket_bytes(self) -> int:
        """Device bytes of the most a bucket holds: the largest partition of each type on each side,
        and the unpartitioned tables."""
        def largest(etype: str) -> int:
            return max(partition_bytes(count, self.cfg.entity_dimension(t)) for (t, _), count in self.counts.items()
                       if t == etype)

        sides = [*self.layout.lhs_types, *self.layout.rhs_types, *self.layout.unpartitioned]
        return sum(largest(etype) for etype in sides if any(t == etype for t, _ in self.counts))

    def scale_learning_rates(self, scale: float) -> None:
        """Train on at ``scale`` × the config's ``lr`` and ``relation_lr`` from now on (``--lr-decay``)."""
        lr, relation_lr = self.config_lrs
        self.model.spec = dataclasses.replace(self.model.spec, lr=lr * scale, relation_lr=relation_lr * scale)
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = relation_lr * scale

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
            ahead = self.prefetcher.take(("partition", step.index, key))
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
        upcoming = self.scheduler.upcoming()
        if upcoming is None:  # the last bucket of the pass, or not known in advance (a distributed run)
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
        edges_np = self.prefetcher.take(("edges", step.index, bucket))
        if edges_np is None:
            edges_np = self._read_edges(step, bucket)
        edges = BucketEdges.from_bucket(edges_np, self.device, str(self._bucket_path(step, bucket)))
        key = ChunkKey(step.edge_path_idx, step.edge_chunk_idx, bucket.lhs, bucket.rhs)
        if step.epoch_idx == 0 and self.coordinator.first_epoch_delay > 0:
            time.sleep(self.coordinator.first_epoch_delay)  # as the original's hogwild_delay
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
                with self.coordinator.shared_update:
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

    @property
    def eval_ranks_every_entity(self) -> bool:
        """Held-out edges are ranked against every entity of the partition, not the eval negatives
        (:func:`pbgtrain.ranking.eval_ranks_every_entity`)."""
        return eval_ranks_every_entity(self.model.spec, self.cfg.batch_size, self.counts.values())

    def eval_protocol(self) -> EvalProtocol:
        """How held-out edges are ranked (:attr:`eval_ranks_every_entity`)."""
        neg = self.model.spec.eval_negatives  # a chunk of batch negatives never exceeds a batch
        num_batch_negs = min(neg.num_batch_negs, self.cfg.batch_size)
        if self.eval_ranks_every_entity:
            return EvalProtocol(False, f"all entities of the partition as candidates (at most "
                                f"{max(self.counts.values()):,}, no more than the "
                                f"{num_batch_negs + neg.num_uniform_negs:,} eval negatives)", SIDES)
        return EvalProtocol.sampled(num_batch_negs, neg.num_uniform_negs)

    @torch.no_grad()
    def evaluate(self, idx: torch.Tensor, edges: BucketEdges, bucket: Bucket) -> RankingAccumulator:
        """Held-out edges ranked against the eval negatives (eval_num_batch_negs + eval_num_uniform_negs)."""
        cfg = self.cfg
        every_entity = self.eval_ranks_every_entity
        seed = stable_seed("auc", self.options.seed, bucket.lhs, bucket.rhs)
        acc = RankingAccumulator(self.eval_protocol(), seed=seed)
        batch_size = cfg.batch_size
        groups = [(0, idx)] if cfg.dynamic_relations else [
            (r, idx[edges.rel[idx] == r]) for r in range(len(cfg.relations))]
        for r, sel in groups:
            relation = cfg.relations[r]
            for start in range(0, len(sel), batch_size):
                part = sel[start:start + batch_size]
                rel_of: int | torch.Tensor = edges.rel[part] if cfg.dynamic_relations else r
                batch = edges.batch(part, rel_of, *self.model.spec.featurized_sides(relation))
                lhs_t, rhs_t = self.table(relation.lhs, bucket, "lhs"), self.table(relation.rhs, bucket, "rhs")
                result = eval_step(self.model, lhs_t, rhs_t, batch, generator=self.generator)
                if every_entity:  # the loss is the sampled objective's; the ranks are exact
                    rank_all_entities(acc, self.model, lhs_t, rhs_t, batch.lhs, batch.rel, batch.rhs)
                else:
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
                self.coordinator.waiting()
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
        """Train every bucket this process is granted in ``step``, then commit the version."""
        started = time.perf_counter()
        stats = StepStats()
        before_all: list[RankingAccumulator] = []
        after_all: list[RankingAccumulator] = []
        lines = []
        total_edges = sum(self._chunk_length(step, b) for b in all_buckets(*self.cfg.bucket_grid()))
        reporter.iteration_started(str(step), self.num_buckets, total_edges)
        self.coordinator.iteration_started()
        for bucket, position in self.buckets_of_pass(step):
            self.swap_to(bucket, step)
            self.read_ahead(step)
            bucket_started, wall_started = time.perf_counter(), time.time()
            bucket_stats, before, after = self.train_bucket(step, bucket, reporter)
            stats = stats + bucket_stats
            if before is not None and after is not None:
                before_all.append(before)
                after_all.append(after)
            line = stats_line(step, step.index * self.num_buckets + position, bucket, bucket_stats, before, after)
            line[EXTRA_KEY] = {**line.get(EXTRA_KEY, {}), **self.coordinator.stats_tags,
                               "trained_from": wall_started, "trained_until": time.time()}
            if self.frozen:  # the checkpoint does not record --freeze; the learning curve does
                line[EXTRA_KEY]["frozen_types"] = sorted(self.frozen)
            lines.append(line)
            reporter.bucket_done(f"  bucket {bucket}: {bucket_stats.count:,} edges in "
                                 f"{time.perf_counter() - bucket_started:.2f} s, loss "
                                 f"{bucket_stats.loss / max(bucket_stats.count, 1):.4g}"
                                 + (f", eval {format_metrics(after.result().values())}" if after is not None
                                    else ""))
        self.swap_to(None, step)
        self.prefetcher.discard()  # nothing read ahead outlives its pass
        outcome = Outcome(stats, held_out_metrics(before_all), held_out_metrics(after_all))
        version, outcome = self.coordinator.commit(step, lines, outcome,
                                                   functools.partial(self.write_version, step))
        return IterationRecord(version, step, time.perf_counter() - started, outcome.train, outcome.eval_before,
                               outcome.eval_after)

    def write_version(self, step: IterationStep, lines: list[StatsLine]) -> int:
        """Append ``lines`` (the iteration's stats) and commit the version ``step`` builds, with what
        this process holds: its partitions in memory, the model and the optimizer state."""
        return commit_iteration(self.ckpt, step, lines, [*self.resident.items(), *self.cache.items()],
                                self.counts.keys(), self.model_params(), self.optimizer_state())

    def handle(self) -> TrainerHandle:
        """What the coordinator is given of this trainer at the start."""
        return TrainerHandle(self.ckpt, self.frozen, self.shared_tensors)

    def shared_tensors(self, frozen: bool = False) -> list[torch.Tensor]:
        """The state every bucket updates (``frozen``: what ``--freeze`` keeps fixed instead): the
        model's parameters, their optimizer state, the unpartitioned tables and their Adagrad sums."""
        tensors = [p.data for p in self.model.parameters() if p.requires_grad != frozen]
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                for param in group["params"]:
                    if param.requires_grad == frozen:
                        continue
                    state = self.optimizer.state[param]
                    tensors += [state[k] for k in sorted(state) if isinstance(state[k], torch.Tensor)]
        for key in self.layout.always_resident():
            if key in self.resident and (key[0] in self.frozen) == frozen:
                tensors += [self.resident[key].weights, self.resident[key].adagrad_sum]
        return tensors

    def movement_report(self) -> dict[str, Any]:
        """This process's partition traffic and waiting (:class:`MovementStats`), for the benchmark."""
        return {**vars(self.movement), "partitions_kept_in_memory": self.cache.hits}

    def close(self) -> None:
        """Stop reading ahead (the background thread ends)."""
        self.prefetcher.close()
        self.bucket_cache.close()

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
