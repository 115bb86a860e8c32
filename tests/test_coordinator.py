"""The run-coordination seam (``pbgtrain.training.coordinator``): the trainer and the fit loop ask their
coordinator, never which kind it is, so a stand-in sees every start, commit and stop decision."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pbgio.testing.planted import planted_graph
from pbgtrain import train
from pbgtrain.checkpointing import StatsLine
from pbgtrain.config import load_run_config
from pbgtrain.schedule.batching import IterationStep
from pbgtrain.train import FitOptions
from pbgtrain.training.coordinator import LocalCoordinator, Outcome, TrainerHandle

PLANTED = {"num_nodes": 200, "num_edges": 4000, "num_epochs": 3, "num_edge_chunks": 1, "eval_fraction": 0.05}


class Recording(LocalCoordinator):
    """A single process that records what the loop asked, and stops after ``stop_after``."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.stop_after = stop_after
        self.started: TrainerHandle | None = None
        self.commits: list[tuple[int, list[int]]] = []
        self.finished: dict[str, Any] | None = None

    def start(self, trainer: TrainerHandle) -> None:
        self.started = trainer

    def commit(self, step: IterationStep, lines: list[StatsLine], outcome: Outcome,
               write: Callable[[list[StatsLine]], int]) -> tuple[int, Outcome]:
        self.commits.append((step.version, [line["index"] for line in lines]))
        return super().commit(step, lines, outcome, write)

    def agree_to_stop(self, version: int, stop: bool) -> bool:
        return stop or version == self.stop_after

    def finish(self, movement: dict[str, Any]) -> list[dict[str, Any]]:
        self.finished = movement
        return super().finish(movement)


def test_the_coordinator_commits_and_decides_when_to_stop(tmp_path: Path) -> None:
    config = planted_graph(tmp_path / "graph", num_partitions=2, **PLANTED)
    coordinator = Recording(stop_after=2)
    result = train._fit(train.resolve_fit(load_run_config(config, ["workers=1"]), FitOptions()), coordinator)

    assert coordinator.started is not None and coordinator.started.checkpoint.committed == 2
    assert result.stopped_early and result.final_version == 2 and len(result.iterations) == 2
    # every bucket's line goes through the coordinator's commit, in the iteration's bucket positions
    assert [(version, sorted(index)) for version, index in coordinator.commits] == \
        [(1, [0, 1, 2, 3]), (2, [4, 5, 6, 7])]
    lines = [json.loads(line) for line in (config.parent / "checkpoint" / "training_stats.json").read_text()
             .splitlines()]
    averages = [line for line in lines if "eval_stats_chunk_avg" in line]
    assert [line["index"] for line in averages] == [3, 7]  # one held-out average per iteration, at its end
    assert len(lines) == 2 * 4 + 2 + 1 and all(line["pbgtrain"]["rank"] == 0 for line in lines if "stats" in line)
    assert lines[-1]["pbgtrain"]["run"]["version"] == 2  # the run's record (pbgtrain.run_log), last
    assert coordinator.finished is not None and result.movement == [{"rank": 0, **coordinator.finished}]
