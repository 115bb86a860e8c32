"""The distributed :class:`~pbgtrain.training.coordinator.Coordinator`: one trainer of many, from start to commit.

- **Placement**: rank 0 leads (validates, holds the checkpoint lock, tidies, writes the run's
  notes); a bare ``cuda`` is ``cuda:LOCAL_RANK``; the machine's cores are split among its
  trainers; no partition stays in memory once let go; ranks other than 0 wait
  ``hogwild_delay`` before each bucket of the first epoch; stats lines name the rank.
- **Start**: the ranks check that they see the same checkpoint directory (a probe file from
  rank 0, the same committed version), then agree on the shared state (rank 0's copy).
- **Buckets** come from the :class:`~pbgtrain.distributed.lock_server.LockServerScheduler`, which
  also starts each iteration's shared-state rounds and checks the other trainers while it waits.
- **Partitions move through the checkpoint directory**, via pbgio: a trainer that lets a
  partition go writes it into the version being built (``v{N+1}``, atomic and fsynced, as a
  single trainer does when it swaps) and marks it in the store
  (:class:`~pbgtrain.distributed.lock_server.StoreWritten`, which the checkpoint asks) before
  unlocking it; the next holder reads that file. The version being
  built needs every trained partition on disk at the end of the iteration anyway, so the write
  is no extra cost in bytes written per iteration beyond what one trainer swapping pays; the
  bytes each rank saved and loaded are counted (:class:`pbgtrain.training.records.MovementStats`).
- **Shared state** (relation parameters, global embeddings, unpartitioned types, their
  optimizer state): :class:`~pbgtrain.distributed.shared.SharedStateSync`. What ``--freeze``
  keeps fixed (frozen types' unpartitioned tables and global embeddings) is agreed on at the
  start and left out of the rounds; every rank must freeze the same types (checked at the start).
- **Commit**, once per iteration: every rank has written the partitions it held; the shared
  state is agreed; each rank posts its stats lines to the store; barrier; rank 0 commits with
  every rank's lines, through the one commit path of every run (the trainer's ``write``:
  :func:`pbgtrain.checkpointing.commit_iteration`: the stats, the agreed model and
  unpartitioned embeddings, the version file last, the old version removed); barrier. A
  failure anywhere before rank 0's version write leaves the last version committed.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from statistics import mean
from typing import Any

from pbgio.config import ConfigSchema
from pbgtrain.checkpointing import StatsLine, TrainingCheckpoint
from pbgtrain.distributed.cluster import (
    PEER_TIMEOUT_DEFAULT,
    RERUN_HINT,
    Cluster,
    DistributedError,
    PeerFailure,
    resolve_launch,
)
from pbgtrain.distributed.lock_server import LockServerScheduler
from pbgtrain.distributed.shared import SharedStateSync
from pbgtrain.model import StepStats
from pbgtrain.progress import Reporter, make_reporter
from pbgtrain.schedule.batching import IterationStep
from pbgtrain.schedule.buckets import BucketScheduler, PartitionKey, PartitionSides
from pbgtrain.training.coordinator import Coordinator, LocalCoordinator, Outcome, Placement, TrainerHandle

PROGRESS_PUSH_SECONDS = 0.5
STATS_LINES_PER_KEY = 500  # a bucket's line is at most a few KB


@dataclass(frozen=True)
class _Started:
    checkpoint: TrainingCheckpoint
    sync: SharedStateSync


class DistributedCoordinator:
    """One trainer of a distributed run (see the module)."""

    def __init__(self, cluster: Cluster, config: ConfigSchema) -> None:
        self.cluster = cluster
        rank = cluster.rank
        self.placement = Placement(
            single_process=False, leads=rank == 0, rank=rank,
            device_index=int(os.environ.get("LOCAL_RANK", "0")),  # one GPU per local trainer
            local_trainers=cluster.local_world_size,
            keeps_partitions=False,  # another trainer may need a partition as soon as it is let go
            first_epoch_delay=config.hogwild_delay if rank > 0 else 0.0)  # as the original: the others start late
        self._scheduler: LockServerScheduler | None = None  # made with the trainer (scheduler)
        self._started: _Started | None = None  # what start() was given and made

    def scheduler(self, config: ConfigSchema, layout: PartitionSides, counts: Mapping[PartitionKey, int],
                  seed: int) -> BucketScheduler:
        if config.bucket_grid() == (1, 1):
            raise DistributedError("distributed training needs more than one bucket: give an entity type "
                                   "num_partitions > 1 (with one bucket, one trainer would do all the work)")
        rows = {etype: round(mean(counts[(etype, p)] for p in range(entity.num_partitions)))
                for etype, entity in config.entities.items()}
        self._scheduler = LockServerScheduler(self.cluster, *config.bucket_grid(), config.bucket_order, layout, rows,
                                              seed=seed, tree_init=config.distributed_tree_init_order,
                                              on_new_pass=self._iteration_started)
        return self._scheduler

    def barrier(self, name: str) -> None:
        self.cluster.barrier(name)

    # ---- start
    def start(self, trainer: TrainerHandle) -> None:
        """Check that every rank sees rank 0's checkpoint directory, at the same version, and freezes
        the same types; then make every copy of the shared state rank 0's."""
        cluster, ckpt = self.cluster, trainer.checkpoint
        sync = SharedStateSync(cluster, lambda: trainer.shared_tensors(False), lambda: trainer.shared_tensors(True),
                               lock=trainer.update_lock)
        self._started = _Started(ckpt, sync)
        if cluster.rank == 0:
            token = secrets.token_hex(8)
            ckpt.dir.write_probe(token)
            cluster.publish("start/probe", token)
            cluster.publish("start/version", str(ckpt.committed))
        token = cluster.fetch("start/probe")
        if ckpt.dir.read_probe() != token:
            raise DistributedError(f"rank {cluster.rank} does not see rank 0's files in checkpoint_path "
                                   f"{ckpt.dir.path}: every trainer needs the same checkpoint directory "
                                   "(a shared file system)")
        frozen = sorted(trainer.frozen)
        if cluster.rank == 0:
            cluster.publish("start/frozen", json.dumps(frozen))
        leader_frozen = json.loads(cluster.fetch("start/frozen"))
        if leader_frozen != frozen:
            raise DistributedError(f"rank {cluster.rank} freezes {frozen}, rank 0 freezes "
                                   f"{leader_frozen}: give every trainer the same --freeze options")
        version = int(cluster.fetch("start/version"))
        if version != ckpt.committed:
            raise DistributedError(f"rank {cluster.rank} sees checkpoint version {ckpt.committed} in "
                                   f"{ckpt.dir.path}, rank 0 sees {version}: every trainer needs the same "
                                   "checkpoint directory (a shared file system)")
        cluster.barrier("started")
        if cluster.rank == 0:
            ckpt.dir.remove_probe()
        sync.agree()

    def _iteration_started(self) -> None:
        """Each pass (iteration) starts the shared-state rounds (its scheduler calls this)."""
        self._run().sync.start()

    def _run(self) -> _Started:
        if self._started is None:
            raise RuntimeError("the run has not started (DistributedCoordinator.start)")
        return self._started

    # ---- commit
    def commit(self, step: IterationStep, lines: list[StatsLine], outcome: Outcome,
               write: Callable[[list[StatsLine]], int]) -> tuple[int, Outcome]:
        """Agree, then rank 0 writes and commits version ``step.version`` with every rank's lines;
        reports the whole run's training stats on rank 0, this rank's elsewhere, and no held-out
        figures (one rank's buckets are not the run's; ``training_stats.json`` has the run's)."""
        cluster = self.cluster
        version = step.version
        run = self._run()
        run.sync.finish()
        self._post_stats(version, lines)
        cluster.barrier("written")
        if cluster.rank != 0:
            cluster.barrier("committed")
            run.checkpoint.advance(version)  # rank 0 committed it
            return version, Outcome(outcome.train)
        every = [line for r in range(cluster.world_size) for line in self._take_stats(version, r)]
        committed = write(every)
        cluster.barrier("committed")
        return committed, Outcome(run_totals(every))

    def _post_stats(self, version: int, records: list[StatsLine]) -> None:
        """This rank's stats lines, in pieces well under the store's 8 MiB limit on a value."""
        pieces = [records[i:i + STATS_LINES_PER_KEY] for i in range(0, len(records), STATS_LINES_PER_KEY)]
        for i, piece in enumerate(pieces):
            self.cluster.publish(f"stats/{version}/{self.cluster.rank}/{i}", json.dumps(piece))
        self.cluster.publish(f"stats/{version}/{self.cluster.rank}", str(len(pieces)))

    def _take_stats(self, version: int, rank: int) -> list[StatsLine]:
        """Rank ``rank``'s stats lines, removed from the store (which keeps no history)."""
        key = f"stats/{version}/{rank}"
        lines = []
        for i in range(int(self.cluster.fetch(key))):
            lines += json.loads(self.cluster.fetch(f"{key}/{i}"))
            self.cluster.store.delete_key(f"{key}/{i}")
        self.cluster.store.delete_key(key)
        return lines

    def agree_to_stop(self, version: int, stop: bool) -> bool:
        """Rank 0's decision to stop after ``version``, for every rank."""
        key = f"stop/{version}"
        if self.cluster.rank == 0:
            self.cluster.publish(key, "1" if stop else "0")
        return self.cluster.fetch(key) == "1"

    def finish(self, movement: dict[str, Any]) -> list[dict[str, Any]]:
        """Post this rank's traffic; rank 0 returns everyone's (the others: nothing)."""
        cluster, sync = self.cluster, self._run().sync
        scheduler_waits = self._scheduler.waits if self._scheduler is not None else 0
        mine = {"rank": cluster.rank, **movement, "waits": scheduler_waits, "sync_rounds": sync.rounds,
                "sync_bytes": sync.bytes_reduced, "sync_seconds": sync.seconds_reducing}
        cluster.publish(f"finished/{cluster.rank}", json.dumps(mine))
        if cluster.rank != 0:
            return []
        return [json.loads(cluster.fetch(f"finished/{r}")) for r in range(cluster.world_size)]

    # ---- progress
    @contextmanager
    def progress(self, interactive: bool, total_iterations: int, done_iterations: int,
                 verbose: int) -> Iterator[Reporter]:
        """Bars on rank 0 only, plain lines prefixed with the rank, and the whole run's edges."""
        rank = self.cluster.rank
        with make_reporter(interactive and rank == 0, total_iterations, done_iterations, verbose,
                           prefix=f"[rank {rank}] ") as reporter:
            yield RunWideReporter(reporter, self.cluster)


@contextmanager
def joined(config: ConfigSchema, *, rank: int | None = None, peer_timeout: float | None = None,
           env: Mapping[str, str] = os.environ) -> Iterator[Coordinator]:
    """The coordinator of this process: a :class:`~pbgtrain.training.coordinator.LocalCoordinator` alone;
    as one trainer of a distributed run (torchrun's environment ``env``, or ``--rank`` with
    ``num_machines`` > 1), a :class:`DistributedCoordinator` of the joined run, which it leaves
    when the body ends (failing together with the others when it raises: :class:`Cluster`)."""
    launch = resolve_launch(num_machines=config.num_machines, init_method=config.distributed_init_method,
                            rank=rank, env=env)
    if launch is None:
        yield LocalCoordinator()
        return
    try:
        with Cluster(launch, peer_timeout=peer_timeout or PEER_TIMEOUT_DEFAULT) as cluster, \
                cluster.translating_interrupts():
            yield DistributedCoordinator(cluster, config)
            cluster.leave()
    except PeerFailure as exc:
        raise PeerFailure(exc.rank, f"{exc}; {RERUN_HINT.format(world=launch.world_size)}") from None


def run_totals(lines: list[StatsLine]) -> StepStats:
    """The training stats of every rank's bucket lines, summed."""
    total = StepStats()
    for line in lines:
        if "stats" not in line:
            continue
        count = line["stats"]["count"]
        metrics = line["stats"]["metrics"]
        total = total + StepStats(metrics.get("loss", 0.0) * count, metrics.get("reg", 0.0) * count, count,
                                  round(metrics.get("violators_lhs", 0.0) * count),
                                  round(metrics.get("violators_rhs", 0.0) * count))
    return total


class RunWideReporter(Reporter):
    """Adds the other ranks' edges to this rank's progress (rank 0 shows the whole run's edges/s).

    Each rank adds what it trained to one store counter per iteration every half second; the
    counter's new value is the run's total, which the wrapped reporter is advanced to.
    """

    def __init__(self, inner: Reporter, cluster: Cluster) -> None:
        super().__init__(inner.stream, inner.verbose)
        self.inner = inner
        self.cluster = cluster
        self._iteration = ""
        self._pending = 0
        self._shown = 0
        self._pushed_at = 0.0

    def log(self, message: str) -> None:
        self.inner.log(message)

    def iteration_started(self, description: str, num_buckets: int, num_edges: int) -> None:
        self._iteration, self._pending, self._shown = description, 0, 0
        self.inner.iteration_started(description, num_buckets, num_edges)

    def edges_done(self, count: int, loss: float) -> None:
        self._pending += count
        now = time.monotonic()
        if now - self._pushed_at < PROGRESS_PUSH_SECONDS:
            return
        self._pushed_at = now
        total = self.cluster.add(f"progress/{self._iteration}", self._pending)
        self._pending = 0
        if total > self._shown:
            self.inner.edges_done(total - self._shown, loss)
            self._shown = total

    def bucket_done(self, line: str) -> None:
        self.inner.bucket_done(line)

    def committed(self, line: str) -> None:
        self.inner.committed(line)
