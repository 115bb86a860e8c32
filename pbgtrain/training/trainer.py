"""One trainer: the model, one bucket, one iteration.

A :class:`Trainer` holds the state of a run in one process and trains one iteration at a time
(:meth:`Trainer.run_iteration`): the buckets are visited as the scheduler grants them; before
each, its :class:`~pbgtrain.training.residency.PartitionStore` makes exactly the bucket's
partitions resident (swapping, parking and reading ahead). The bucket's edge chunk comes from
:class:`~pbgtrain.training.edge_chunks.EdgeChunks`; ``eval_fraction`` of it is held out (ranked
before and after training on the bucket: :class:`~pbgtrain.training.held_out.HeldOutRanking`),
the rest is shuffled and batched, and each batch takes one :func:`~pbgtrain.model.train_step`.
At the end of the iteration its stats lines and the version are committed
(:func:`~pbgtrain.checkpointing.commit_iteration`).

Whether the trainer is alone or one of many is its :class:`~pbgtrain.training.coordinator.Coordinator`'s
business: the trainer asks it for the bucket scheduler and to commit, and never which kind it is.
Its options come checked in a :class:`~pbgtrain.training.fit_plan.FitPlan`.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from pbgio import interrupts
from pbgio.entities import read_dynamic_rel_count, read_entity_count
from pbgio.spec.stats import EXTRA_KEY
from pbgio.storage import LocalCache
from pbgtrain.checkpointing import StatsLine, TrainingCheckpoint, commit_iteration, model_params
from pbgtrain.choices import OperatorInit
from pbgtrain.metrics import RankingAccumulator
from pbgtrain.model import BucketEdges, EmbeddingModel, StepStats
from pbgtrain.model.model import make_relation_optimizer
from pbgtrain.model.precision import precision_scope
from pbgtrain.model.runner import make_runner
from pbgtrain.progress import Reporter
from pbgtrain.schedule.batching import ChunkKey, IterationStep, PreparedChunk, prepare_chunk, stable_seed
from pbgtrain.schedule.buckets import Bucket, PartitionSides, Wait, all_buckets
from pbgtrain.training.coordinator import Coordinator, LocalCoordinator, Outcome, TrainerHandle
from pbgtrain.training.device import local_device
from pbgtrain.training.edge_chunks import EdgeChunks
from pbgtrain.training.fit_plan import FitPlan
from pbgtrain.training.held_out import HeldOutRanking
from pbgtrain.training.records import IterationRecord, MovementStats, format_metrics, held_out_metrics, stats_line
from pbgtrain.training.residency import GIB, PartitionStore, Prefetcher, bucket_bytes, default_budget

PROGRESS_EVERY = 32
"""Batches between two reads of the running loss from the device (the progress bar's loss)."""


class Trainer:
    """Holds the state of one run: model, optimizer, partitions, checkpoint.

    ``coordinator`` (default: a :class:`~pbgtrain.training.coordinator.LocalCoordinator`, a single
    process) is the run it belongs to: it hands out the buckets, commits, and says where this
    process sits (with a distributed one, buckets come from the lock server, partitions move
    through the checkpoint directory, and the shared state is kept in agreement).
    """

    def __init__(self, plan: FitPlan, coordinator: Coordinator | None = None,
                 bucket_cache: LocalCache | None = None) -> None:
        self.plan = plan
        layout, options = plan.layout, plan.options
        self.cfg = cfg = layout.config
        self.coordinator = coordinator = coordinator or LocalCoordinator()
        placement = coordinator.placement
        self.device = local_device(plan.device, placement.device_index)
        self.counts = {(etype, part): read_entity_count(layout.entity_path, etype, part)
                       for etype, entity in cfg.entities.items() for part in range(entity.num_partitions)}
        num_dynamic = read_dynamic_rel_count(layout.entity_path) if cfg.dynamic_relations else None
        self.frozen = options.frozen_types
        self.model = EmbeddingModel.from_config(cfg, num_dynamic, frozen=self.frozen,
                                                relation_prediction=options.relation_prediction)
        if plan.operator_init is OperatorInit.random:  # before the restore: what a checkpoint holds replaces it
            self.model.draw_operators(cfg.init_scale, stable_seed("operators", options.seed))
        self.model = self.model.to(self.device)
        self.optimizer = make_relation_optimizer(self.model)
        self.config_lrs = (self.model.spec.lr, self.model.spec.relation_lr)
        partitions = PartitionSides.from_config(cfg)
        self.scheduler = coordinator.scheduler(cfg, partitions, self.counts, options.seed)
        self.ckpt = TrainingCheckpoint(layout.checkpoint_path, cfg, init_path=layout.init_path, seed=options.seed,
                                       device=self.device, counts=self.counts, written=self.scheduler.written)
        self.ckpt.restore_model(self.model, self.optimizer, self.model.spec.relation_lr)
        self.generator = torch.Generator(device=self.device)
        # the step, chosen once (plan.step): the trainer gives it each batch and reads its sums
        self.runner = make_runner(plan.step, self.model, self.optimizer, self.device, cfg.batch_size,
                                  generator=self.generator, static_shapes=options.static_shapes)
        self.movement = MovementStats()
        self.update_lock = threading.Lock()  # held while a step updates the shared state (a distributed run syncs it)
        self.prefetcher = Prefetcher()  # reads ahead what the scheduler says comes next (its thread starts then)
        self.edges = EdgeChunks(layout, self.counts, self.model.spec.num_dynamic_rels,
                                bucket_cache or LocalCache(int(options.remote_cache * GIB)), self.prefetcher)
        # Swapped-out partitions stay in memory within the budget when the placement allows it (a
        # single process; in a distributed run another trainer may need them at once).
        budget = default_budget(self.device, bucket_bytes(cfg, partitions, self.counts)) \
            if options.partition_memory is None else int(options.partition_memory * GIB)
        self.partitions = PartitionStore(
            self.ckpt, partitions, self.counts, self.device, self.scheduler, self.prefetcher, self.movement,
            budget_bytes=budget if placement.keeps_partitions else 0,
            read_ahead=self.device.type == "cuda" if options.read_ahead_partitions is None
            else options.read_ahead_partitions)
        self.held_out = HeldOutRanking(self.model, cfg, self.counts.values(), options.seed)

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

    # ---- one bucket
    def train_bucket(self, step: IterationStep, bucket: Bucket,
                     reporter: Reporter) -> tuple[StepStats, RankingAccumulator | None, RankingAccumulator | None]:
        """Train ``bucket``'s chunk of ``step``: its held-out edges ranked before and after."""
        cfg, seed = self.cfg, self.plan.options.seed
        edges_np = self.edges.read(step, bucket)
        edges = BucketEdges.from_bucket(edges_np, self.device, str(self.edges.path(step, bucket)))
        key = ChunkKey(step.edge_path_idx, step.edge_chunk_idx, bucket.lhs, bucket.rhs)
        if step.epoch_idx == 0 and self.coordinator.placement.first_epoch_delay > 0:
            time.sleep(self.coordinator.placement.first_epoch_delay)  # as the original's hogwild_delay
        prepared = prepare_chunk(edges_np.rel, key=key, eval_fraction=cfg.eval_fraction, batch_size=cfg.batch_size,
                                 dynamic=cfg.dynamic_relations, shuffle_seed=key.shuffle_seed(seed, step.epoch_idx))
        negatives_seed = stable_seed("negatives", seed, step.index, bucket.lhs, bucket.rhs)
        self.generator.manual_seed(negatives_seed)
        self.runner.reseed(negatives_seed)
        held = prepared.held_out.eval_idx.to(self.device)
        before = self.held_out.rank(held, edges, bucket, self.partitions.table, self.generator) if len(held) else None
        with precision_scope(self.plan.precision, self.device):
            stats = self._train_batches(prepared, edges, bucket, reporter)
        after = self.held_out.rank(held, edges, bucket, self.partitions.table, self.generator) if len(held) else None
        return stats, before, after

    def _train_batches(self, prepared: PreparedChunk, edges: BucketEdges, bucket: Bucket,
                       reporter: Reporter) -> StepStats:
        """One step per batch of the chunk (the run's :class:`~pbgtrain.model.runner.StepRunner`);
        the sums stay on the device, read back every :data:`PROGRESS_EVERY` batches (the progress
        bar's loss) and at the end."""
        cfg, runner = self.cfg, self.runner
        shown, loss_shown = StepStats(), 0.0
        for batches in prepared.worker_batches:
            on_device = batches.to(self.device)  # one copy of the chunk's order; each batch a slice of it
            for k, idx in enumerate(on_device):
                rel = None if cfg.dynamic_relations else batches.relation(k) or 0
                relation = cfg.relations[rel or 0]
                with self.update_lock:
                    runner.train(edges, idx, rel, self.partitions.table(relation.lhs, bucket, "lhs"),
                                 self.partitions.table(relation.rhs, bucket, "rhs"))
                if runner.totals.steps % PROGRESS_EVERY == 0:
                    now = runner.totals.result()
                    loss_shown = (now.loss - shown.loss) / max(now.count - shown.count, 1)
                    shown = now
                reporter.edges_done(len(idx), loss_shown)
                interrupts.check()
        for note in runner.notes:
            reporter.log(f"note: {note}")
        runner.notes.clear()
        return runner.totals.take()

    # ---- one iteration
    def buckets_of_pass(self, step: IterationStep) -> Iterator[tuple[Bucket, int]]:
        """Yield ``(bucket, position)`` as the scheduler grants them; while it says WAIT, hold nothing."""
        self.scheduler.new_pass(step.index)
        delay = 0.01
        while True:
            asked = time.perf_counter()
            granted = self.scheduler.acquire()
            self.movement.seconds_waiting += time.perf_counter() - asked
            if isinstance(granted, Wait):
                self.partitions.swap_to(None, step)  # save and hand back what we hold, so nobody waits for us
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
        total_edges = sum(self.edges.chunk_length(step, b) for b in all_buckets(*self.cfg.bucket_grid()))
        reporter.iteration_started(str(step), self.num_buckets, total_edges)
        for bucket, position in self.buckets_of_pass(step):
            self.partitions.swap_to(bucket, step)
            self._read_ahead(step)
            bucket_started, wall_started = time.perf_counter(), time.time()
            bucket_stats, before, after = self.train_bucket(step, bucket, reporter)
            stats = stats + bucket_stats
            if before is not None and after is not None:
                before_all.append(before)
                after_all.append(after)
            line = stats_line(step, step.index * self.num_buckets + position, bucket, bucket_stats, before, after)
            line[EXTRA_KEY] = {**line.get(EXTRA_KEY, {}), "rank": self.coordinator.placement.rank,
                               "trained_from": wall_started, "trained_until": time.time()}
            if self.frozen:  # the checkpoint does not record --freeze; the learning curve does
                line[EXTRA_KEY]["frozen_types"] = sorted(self.frozen)
            if self.plan.options.relation_prediction:  # nor --relation-prediction
                line[EXTRA_KEY]["relation_prediction"] = self.plan.options.relation_prediction
            lines.append(line)
            reporter.bucket_done(f"  bucket {bucket}: {bucket_stats.count:,} edges in "
                                 f"{time.perf_counter() - bucket_started:.2f} s, loss "
                                 f"{bucket_stats.loss / max(bucket_stats.count, 1):.4g}"
                                 + (f", eval {format_metrics(after.result().values())}" if after is not None
                                    else ""))
        committing = time.perf_counter()
        self.partitions.swap_to(None, step)  # the partitions held are saved into the version being built
        self.prefetcher.discard()  # nothing read ahead outlives its pass
        outcome = Outcome(stats, held_out_metrics(before_all), held_out_metrics(after_all))
        version, outcome = self.coordinator.commit(step, lines, outcome,
                                                   functools.partial(self.write_version, step))
        ended = time.perf_counter()
        return IterationRecord(version, step, ended - started, outcome.train, outcome.eval_before,
                               outcome.eval_after, commit_seconds=ended - committing)

    def _read_ahead(self, step: IterationStep) -> None:
        """Start reading the next bucket of this pass in the background, when it is known."""
        upcoming = self.scheduler.upcoming()
        if upcoming is None:  # the last bucket of the pass, or not known in advance (a distributed run)
            return
        self.partitions.read_ahead(upcoming, step)
        self.edges.read_ahead(step, upcoming)

    def write_version(self, step: IterationStep, lines: list[StatsLine]) -> int:
        """Append ``lines`` (the iteration's stats) and commit the version ``step`` builds, with what
        this process holds: its partitions in memory, the model and the optimizer state."""
        return commit_iteration(self.ckpt, step, lines, self.partitions.in_memory(), self.counts.keys(),
                                model_params(self.model), self.optimizer_state())

    def handle(self) -> TrainerHandle:
        """What the coordinator is given of this trainer at the start."""
        return TrainerHandle(self.ckpt, self.frozen, self.shared_tensors, self.update_lock)

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
        return tensors + self.partitions.unpartitioned(self.frozen, frozen)

    def movement_report(self) -> dict[str, Any]:
        """This process's partition traffic and waiting (:class:`MovementStats`), for the benchmark."""
        return {**vars(self.movement), "partitions_kept_in_memory": self.partitions.cache.hits}

    def close(self) -> None:
        """Stop reading ahead (the background thread ends)."""
        self.prefetcher.close()
        self.edges.close()

    def optimizer_state(self) -> dict[str, Any] | None:
        return self.optimizer.state_dict() if self.optimizer is not None else None
