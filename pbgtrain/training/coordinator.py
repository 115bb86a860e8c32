"""The run-coordination seam: what the training loop asks of the run it belongs to.

A :class:`~pbgtrain.training.trainer.Trainer` and the fit loop (:mod:`pbgtrain.train`) are written for one
process; everything that differs when several processes train together sits behind one
:class:`Coordinator`, passed in:

- **values fixed at construction**: whether this process *leads* (validates the layout, holds the
  checkpoint lock, tidies the checkpoint directory, writes the run's notes), which GPU a bare
  ``cuda`` means, how many trainers share the machine's cores, whether swapped-out partitions may
  stay in memory, the delay before the first epoch's buckets, what each stats line says of who
  trained it, and the lock a training step holds while it updates the shared state;
- **start** (:meth:`~Coordinator.start`): agree on the checkpoint and the shared state;
- **buckets** (:meth:`~Coordinator.bucket_scheduler`, :meth:`~Coordinator.waiting`): the
  scheduler that hands out the buckets of a pass, and what to do while it says WAIT;
- **commit** (:meth:`~Coordinator.commit`): one version per iteration, always written by
  :func:`pbgtrain.checkpointing.commit_iteration` (here, or on rank 0 with every rank's lines);
- **stop** (:meth:`~Coordinator.agree_to_stop`): every process stops after the same version;
- **finish** and **progress**: the movement figures of the run, and the reporter to write to.

:class:`LocalCoordinator` is the single process: every answer is the trivial one.
:class:`pbgtrain.distributed.coordination.DistributedCoordinator` is one trainer of many. The
trainer never asks which one it has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from pbgio.config import ConfigSchema
from pbgtrain.checkpointing import PartitionKey, StatsLine, TrainingCheckpoint, WrittenPartitions, written_here
from pbgtrain.metrics import RankingMetrics
from pbgtrain.model import StepStats
from pbgtrain.progress import Reporter, make_reporter
from pbgtrain.training.batching import IterationStep
from pbgtrain.training.buckets import BucketScheduler, PartitionLayout, SingleMachineScheduler


@dataclass(frozen=True)
class TrainerHandle:
    """What a coordinator is given of its trainer at the start (and it uses nothing else of it)."""

    checkpoint: TrainingCheckpoint
    frozen: frozenset[str]  # --freeze: entity types whose embeddings stay as loaded
    shared_tensors: Callable[[bool], list[Tensor]]
    """The state every bucket updates (relation parameters, global embeddings, unpartitioned
    tables, their optimizer state); ``shared_tensors(True)``: the part ``--freeze`` keeps fixed."""


@dataclass(frozen=True)
class Outcome:
    """What an iteration trained, as this process reports it (the console line, the summary)."""

    train: StepStats
    eval_before: RankingMetrics | None = None
    eval_after: RankingMetrics | None = None


class Coordinator(Protocol):
    """How one trainer process runs with the others of its run, or alone (see the module)."""

    @property
    def leads(self) -> bool:
        """Whether this process validates the layout, holds the checkpoint lock, tidies the
        checkpoint directory and writes the run's notes (the single process, or rank 0)."""

    @property
    def device_index(self) -> int | None:
        """Which GPU a bare ``cuda`` means for this process (None: torch's current one)."""

    @property
    def local_trainers(self) -> int:
        """Trainers sharing this machine's cores (the default thread count splits them)."""

    @property
    def keeps_partitions(self) -> bool:
        """Whether swapped-out partitions may stay in memory until the commit (within the budget);
        otherwise each is saved at once, for another trainer to read."""

    @property
    def first_epoch_delay(self) -> float:
        """Seconds to wait before each bucket of the first epoch (the original's ``hogwild_delay``,
        for trainers other than the first)."""

    @property
    def stats_tags(self) -> Mapping[str, Any]:
        """What each bucket's stats line says of the trainer that trained it (under ``pbgtrain``)."""

    @property
    def shared_update(self) -> AbstractContextManager[Any]:
        """Held while a training step updates the shared state."""

    def written(self, version: int) -> WrittenPartitions:
        """Which partitions are already in ``version`` (being built), for the checkpoint to ask."""

    def bucket_scheduler(self, config: ConfigSchema, layout: PartitionLayout, counts: Mapping[PartitionKey, int],
                         seed: int) -> BucketScheduler:
        """The scheduler of this process's buckets."""

    def barrier(self, name: str) -> None:
        """Wait until every process of the run is here."""

    def start(self, trainer: TrainerHandle) -> None:
        """Agree on the checkpoint and the shared state before the first iteration."""

    def waiting(self) -> None:
        """Called while the scheduler says WAIT (raises when the run has failed elsewhere)."""

    def iteration_started(self) -> None:
        """Called before the first bucket of each iteration."""

    def commit(self, step: IterationStep, lines: list[StatsLine], outcome: Outcome,
               write: Callable[[list[StatsLine]], int]) -> tuple[int, Outcome]:
        """Commit ``step`` once its buckets are trained: ``write(lines)`` appends the stats lines of
        the iteration and commits the version (:func:`pbgtrain.checkpointing.commit_iteration`);
        returns the version and what to report of the iteration."""

    def agree_to_stop(self, version: int, stop: bool) -> bool:
        """Whether to stop after ``version``: the leading process's ``stop``, for every process."""

    def finish(self, movement: dict[str, Any]) -> list[dict[str, Any]]:
        """The partition traffic of the run (this process's ``movement`` among them)."""

    def progress(self, interactive: bool, total_iterations: int, done_iterations: int,
                 verbose: int) -> AbstractContextManager[Reporter]:
        """The reporter the run writes to (a context: bars are shown while it is open)."""


class LocalCoordinator:
    """A single process: it leads, keeps partitions in memory, commits what it trained."""

    leads = True
    device_index: int | None = None
    local_trainers = 1
    keeps_partitions = True
    first_epoch_delay = 0.0  # hogwild_delay has no effect on one machine, as in the original

    def __init__(self) -> None:
        self.stats_tags: Mapping[str, Any] = {"rank": 0}
        self.shared_update: AbstractContextManager[Any] = contextlib.nullcontext()

    def written(self, version: int) -> WrittenPartitions:
        return written_here(version)

    def bucket_scheduler(self, config: ConfigSchema, layout: PartitionLayout, counts: Mapping[PartitionKey, int],
                         seed: int) -> BucketScheduler:
        return SingleMachineScheduler.from_config(config, seed=seed)

    def barrier(self, name: str) -> None:
        """Nobody to wait for."""

    def start(self, trainer: TrainerHandle) -> None:
        """Nothing to agree on."""

    def waiting(self) -> None:
        """A single process never waits for a bucket."""

    def iteration_started(self) -> None:
        """Nothing to start."""

    def commit(self, step: IterationStep, lines: list[StatsLine], outcome: Outcome,
               write: Callable[[list[StatsLine]], int]) -> tuple[int, Outcome]:
        return write(lines), outcome

    def agree_to_stop(self, version: int, stop: bool) -> bool:
        return stop

    def finish(self, movement: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"rank": 0, **movement}]

    @contextlib.contextmanager
    def progress(self, interactive: bool, total_iterations: int, done_iterations: int,
                 verbose: int) -> Iterator[Reporter]:
        with make_reporter(interactive, total_iterations, done_iterations, verbose) as reporter:
            yield reporter
