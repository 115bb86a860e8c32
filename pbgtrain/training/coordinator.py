"""The run-coordination seam: what the training loop asks of the run it belongs to.

A :class:`~pbgtrain.training.trainer.Trainer` and the fit loop (:mod:`pbgtrain.train`) are written for one
process; everything that differs when several processes train together sits behind one
:class:`Coordinator`, passed in:

- **where this process sits** (:attr:`~Coordinator.placement`, a frozen :class:`Placement`):
  whether it is alone, whether it *leads* (validates the layout, holds the checkpoint lock,
  tidies the checkpoint directory, writes the run's notes), its rank, which GPU a bare ``cuda``
  means, how many trainers share the machine's cores, whether swapped-out partitions may stay
  in memory, the delay before the first epoch's buckets;
- **buckets** (:meth:`~Coordinator.scheduler`): the scheduler that hands out the buckets of a
  pass, knows which partitions the version being built holds, and waits for other trainers;
- **start** (:meth:`~Coordinator.start`): agree on the checkpoint and the shared state;
- **commit** (:meth:`~Coordinator.commit`): one version per iteration, always written by
  :func:`pbgtrain.checkpointing.commit_iteration` (here, or on rank 0 with every rank's lines);
- **stop** (:meth:`~Coordinator.agree_to_stop`, :meth:`~Coordinator.barrier`): every process
  stops after the same version, and waits for the others where the run needs it;
- **finish** and **progress**: the movement figures of the run, and the reporter to write to.

:class:`LocalCoordinator` is the single process: every answer is the trivial one.
:class:`pbgtrain.distributed.coordination.DistributedCoordinator` is one trainer of many. The
trainer never asks which one it has; the fit loop reads the placement's values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from pbgio.config import ConfigSchema
from pbgtrain.checkpointing import StatsLine, TrainingCheckpoint
from pbgtrain.metrics import RankingMetrics
from pbgtrain.model import StepStats
from pbgtrain.progress import Reporter, make_reporter
from pbgtrain.schedule.batching import IterationStep
from pbgtrain.schedule.buckets import BucketScheduler, PartitionKey, PartitionSides, SingleMachineScheduler


@dataclass(frozen=True)
class Placement:
    """Where one trainer process sits in its run (fixed for the run)."""

    single_process: bool = True
    leads: bool = True  # validates the layout, holds the checkpoint lock, tidies, writes the run's notes
    rank: int = 0  # named on each stats line it writes
    device_index: int | None = None  # which GPU a bare ``cuda`` means (None: torch's current one)
    local_trainers: int = 1  # trainers sharing this machine's cores (the default thread count splits them)
    keeps_partitions: bool = True  # swapped-out partitions may stay in memory until the commit (within a budget)
    first_epoch_delay: float = 0.0  # seconds before each bucket of the first epoch (the original's hogwild_delay)


@dataclass(frozen=True)
class TrainerHandle:
    """What a coordinator is given of its trainer at the start (and it uses nothing else of it)."""

    checkpoint: TrainingCheckpoint
    frozen: frozenset[str]  # --freeze: entity types whose embeddings stay as loaded
    shared_tensors: Callable[[bool], list[Tensor]]
    """The state every bucket updates (relation parameters, global embeddings, unpartitioned
    tables, their optimizer state); ``shared_tensors(True)``: the part ``--freeze`` keeps fixed."""
    update_lock: AbstractContextManager[Any]
    """Held by the trainer while a training step updates the shared state."""


@dataclass(frozen=True)
class Outcome:
    """What an iteration trained, as this process reports it (the console line, the summary)."""

    train: StepStats
    eval_before: RankingMetrics | None = None
    eval_after: RankingMetrics | None = None


class Coordinator(Protocol):
    """How one trainer process runs with the others of its run, or alone (see the module)."""

    @property
    def placement(self) -> Placement:
        """Where this process sits in its run."""

    def scheduler(self, config: ConfigSchema, layout: PartitionSides, counts: Mapping[PartitionKey, int],
                  seed: int) -> BucketScheduler:
        """The scheduler of this process's buckets (and of the partitions written into each version)."""

    def start(self, trainer: TrainerHandle) -> None:
        """Agree on the checkpoint and the shared state before the first iteration."""

    def commit(self, step: IterationStep, lines: list[StatsLine], outcome: Outcome,
               write: Callable[[list[StatsLine]], int]) -> tuple[int, Outcome]:
        """Commit ``step`` once its buckets are trained: ``write(lines)`` appends the stats lines of
        the iteration and commits the version (:func:`pbgtrain.checkpointing.commit_iteration`);
        returns the version and what to report of the iteration."""

    def agree_to_stop(self, version: int, stop: bool) -> bool:
        """Whether to stop after ``version``: the leading process's ``stop``, for every process."""

    def barrier(self, name: str) -> None:
        """Wait until every process of the run is here."""

    def finish(self, movement: dict[str, Any]) -> list[dict[str, Any]]:
        """The partition traffic of the run (this process's ``movement`` among them)."""

    def progress(self, interactive: bool, total_iterations: int, done_iterations: int,
                 verbose: int) -> AbstractContextManager[Reporter]:
        """The reporter the run writes to (a context: bars are shown while it is open)."""


class LocalCoordinator:
    """A single process: it leads, keeps partitions in memory, commits what it trained."""

    placement = Placement()  # hogwild_delay has no effect on one machine, as in the original

    def scheduler(self, config: ConfigSchema, layout: PartitionSides, counts: Mapping[PartitionKey, int],
                  seed: int) -> BucketScheduler:
        return SingleMachineScheduler.from_config(config, seed=seed)

    def start(self, trainer: TrainerHandle) -> None:
        """Nothing to agree on."""

    def commit(self, step: IterationStep, lines: list[StatsLine], outcome: Outcome,
               write: Callable[[list[StatsLine]], int]) -> tuple[int, Outcome]:
        return write(lines), outcome

    def agree_to_stop(self, version: int, stop: bool) -> bool:
        return stop

    def barrier(self, name: str) -> None:
        """Nobody to wait for."""

    def finish(self, movement: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"rank": 0, **movement}]

    @contextlib.contextmanager
    def progress(self, interactive: bool, total_iterations: int, done_iterations: int,
                 verbose: int) -> Iterator[Reporter]:
        with make_reporter(interactive, total_iterations, done_iterations, verbose) as reporter:
            yield reporter
