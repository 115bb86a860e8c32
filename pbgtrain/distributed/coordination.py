"""What one trainer does with the others in a distributed run, from start to commit.

- **Start**: the ranks check that they see the same checkpoint directory (a probe file from
  rank 0, the same committed version), then agree on the shared state (rank 0's copy).
- **Buckets** come from the :class:`~pbgtrain.distributed.scheduler.LockServerScheduler`.
- **Partitions move through the checkpoint directory**, via pbgio: a trainer that lets a
  partition go writes it into the version being built (``v{N+1}``, atomic and fsynced, as a
  single trainer does when it swaps) and marks it in the store before unlocking it; the next
  holder reads that file. The version being built needs every trained partition on disk at the
  end of the iteration anyway, so the write is no extra cost in bytes written per iteration
  beyond what one trainer swapping pays; the bytes each rank saved and loaded are counted
  (:class:`pbgtrain.train.MovementStats`).
- **Shared state** (relation parameters, global embeddings, unpartitioned types, their
  optimizer state): :class:`~pbgtrain.distributed.shared.SharedStateSync`. What ``--freeze``
  keeps fixed (frozen types' unpartitioned tables and global embeddings) is agreed on at the
  start and left out of the rounds; every rank must freeze the same types (checked at the start).
- **Commit**, once per iteration: every rank has written the partitions it held; the shared
  state is agreed; each rank posts its stats lines to the store; barrier; rank 0 appends the
  stats, writes the agreed model and unpartitioned embeddings, and commits the version file
  last (:meth:`pbgtrain.checkpointing.TrainingCheckpoint.commit`), removing the old version;
  barrier. A failure anywhere before rank 0's version write leaves the last version committed.
"""

from __future__ import annotations

import json
import secrets
import time
from statistics import mean
from typing import TYPE_CHECKING, Any

from torch import Tensor

from pbgtrain.distributed.cluster import Cluster, DistributedError
from pbgtrain.distributed.scheduler import LockServerScheduler, partition_key_text
from pbgtrain.distributed.shared import SharedStateSync
from pbgtrain.model import StepStats
from pbgtrain.reporting import Reporter

if TYPE_CHECKING:
    from pbgtrain.batching import IterationStep
    from pbgtrain.checkpointing import PartitionKey, TrainingCheckpoint
    from pbgtrain.train import FitResult, Trainer

PROGRESS_PUSH_SECONDS = 0.5
STATS_LINES_PER_KEY = 500  # a bucket's line is at most a few KB


class StoreWritten:
    """Which partitions are already in the version being built, for every rank (in the store)."""

    def __init__(self, cluster: Cluster, ckpt: TrainingCheckpoint) -> None:
        self.cluster = cluster
        self.ckpt = ckpt

    def _key(self, key: PartitionKey) -> str:
        return f"written/{self.ckpt.committed + 1}/{partition_key_text(key)}"

    def add(self, key: PartitionKey) -> None:
        self.cluster.store.set(self._key(key), "1")

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and bool(self.cluster.store.check([self._key(key)]))

    def clear(self) -> None:
        """Nothing to clear: the keys name the version they belong to."""


class Coordination:
    """The distributed side of one :class:`~pbgtrain.train.Trainer` (see the module)."""

    def __init__(self, cluster: Cluster, trainer: Trainer) -> None:
        self.cluster = cluster
        self.trainer = trainer
        cfg = trainer.cfg
        if cfg.bucket_grid() == (1, 1):
            raise DistributedError("distributed training needs more than one bucket: give an entity type "
                                   "num_partitions > 1 (with one bucket, one trainer would do all the work)")
        rows = {etype: round(mean(trainer.counts[(etype, p)] for p in range(entity.num_partitions)))
                for etype, entity in cfg.entities.items()}
        self.scheduler = LockServerScheduler(cluster, *cfg.bucket_grid(), cfg.bucket_order, trainer.layout, rows,
                                             seed=trainer.options.seed, tree_init=cfg.distributed_tree_init_order)
        trainer.ckpt.written = StoreWritten(cluster, trainer.ckpt)
        trainer.load_unpartitioned()  # part of the shared state, whose size sets the rounds' period
        self.sync = SharedStateSync(cluster, self.shared_tensors, lambda: self.shared_tensors(frozen=True))

    # ---- the shared state
    def shared_tensors(self, frozen: bool = False) -> list[Tensor]:
        """The shared state that trains (``frozen``: what ``--freeze`` keeps fixed instead)."""
        trainer = self.trainer
        tensors = [p.data for p in trainer.model.parameters() if p.requires_grad != frozen]
        if trainer.optimizer is not None:
            for group in trainer.optimizer.param_groups:
                for param in group["params"]:
                    if param.requires_grad == frozen:
                        continue
                    state = trainer.optimizer.state[param]
                    tensors += [state[k] for k in sorted(state) if isinstance(state[k], Tensor)]
        for key in trainer.layout.always_resident():
            if key in trainer.resident and (key[0] in trainer.frozen) == frozen:
                tensors += [trainer.resident[key].weights, trainer.resident[key].adagrad_sum]
        return tensors

    # ---- start
    def run_started(self) -> None:
        cluster, ckpt = self.cluster, self.trainer.ckpt
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
        if cluster.rank == 0:
            cluster.publish("start/frozen", json.dumps(sorted(self.trainer.frozen)))
        frozen = json.loads(cluster.fetch("start/frozen"))
        if frozen != sorted(self.trainer.frozen):
            raise DistributedError(f"rank {cluster.rank} freezes {sorted(self.trainer.frozen)}, rank 0 freezes "
                                   f"{frozen}: give every trainer the same --freeze options")
        version = int(cluster.fetch("start/version"))
        if version != ckpt.committed:
            raise DistributedError(f"rank {cluster.rank} sees checkpoint version {ckpt.committed} in "
                                   f"{ckpt.dir.path}, rank 0 sees {version}: every trainer needs the same "
                                   "checkpoint directory (a shared file system)")
        cluster.barrier("started")
        if cluster.rank == 0:
            ckpt.dir.remove_probe()
        self.sync.agree()

    def iteration_started(self) -> None:
        self.sync.start()

    # ---- commit
    def commit(self, step: IterationStep, records: list[dict[str, Any]], local: StepStats,
               snapshot: int | None) -> tuple[int, StepStats]:
        """Agree, write, commit version ``step.version``; returns it and the stats to report
        (the whole run's on rank 0, this rank's elsewhere)."""
        cluster, trainer = self.cluster, self.trainer
        version = step.version
        self.sync.finish()
        self._post_stats(version, records)
        cluster.barrier("written")
        if cluster.rank != 0:
            cluster.barrier("committed")
            trainer.ckpt.advance(version)
            return version, local
        lines = [line for r in range(cluster.world_size) for line in self._take_stats(version, r)]
        lines.sort(key=lambda line: line["index"])
        average = chunk_average(lines)
        if average is not None:
            lines.append({**{k: lines[0][k] for k in ("epoch_idx", "edge_path_idx", "edge_chunk_idx")},
                          "index": (step.index + 1) * trainer.num_buckets - 1, "eval_stats_chunk_avg": average})
        trainer.ckpt.dir.append_stats(lines)
        trainer.ckpt.commit(trainer.resident.items(), trainer.counts.keys(), trainer.model_params(),
                            trainer.optimizer_state(), step.info(), snapshot_epoch=snapshot)
        cluster.barrier("committed")
        return version, run_totals(lines)

    def _post_stats(self, version: int, records: list[dict[str, Any]]) -> None:
        """This rank's stats lines, in pieces well under the store's 8 MiB limit on a value."""
        pieces = [records[i:i + STATS_LINES_PER_KEY] for i in range(0, len(records), STATS_LINES_PER_KEY)]
        for i, piece in enumerate(pieces):
            self.cluster.publish(f"stats/{version}/{self.cluster.rank}/{i}", json.dumps(piece))
        self.cluster.publish(f"stats/{version}/{self.cluster.rank}", str(len(pieces)))

    def _take_stats(self, version: int, rank: int) -> list[dict[str, Any]]:
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

    def run_finished(self, result: FitResult) -> None:
        """Post this rank's traffic; rank 0 collects everyone's into ``result.movement``."""
        cluster = self.cluster
        mine = {"rank": cluster.rank, **vars(self.trainer.movement), "waits": self.scheduler.waits,
                "sync_rounds": self.sync.rounds, "sync_bytes": self.sync.bytes_reduced,
                "sync_seconds": self.sync.seconds_reducing}
        cluster.publish(f"finished/{cluster.rank}", json.dumps(mine))
        if cluster.rank == 0:
            result.movement = [json.loads(cluster.fetch(f"finished/{r}")) for r in range(cluster.world_size)]

    # ---- progress
    def run_wide(self, reporter: Reporter) -> Reporter:
        return RunWideReporter(reporter, self.cluster)


def chunk_average(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The count-weighted average of the buckets' ``eval_stats_before`` (the original's
    ``Stats.average_list``), or None without held-out edges."""
    befores = [line["eval_stats_before"] for line in lines if "eval_stats_before" in line]
    count = sum(b["count"] for b in befores)
    if not count:
        return None
    keys = sorted({k for b in befores for k in b["metrics"]})
    metrics = {k: sum(b["metrics"][k] * b["count"] for b in befores if k in b["metrics"]) /
               max(sum(b["count"] for b in befores if k in b["metrics"]), 1) for k in keys}
    return {"count": count, "metrics": metrics}


def run_totals(lines: list[dict[str, Any]]) -> StepStats:
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
