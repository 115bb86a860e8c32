"""What an iteration reports: its record, each bucket's line of ``training_stats.json``, the
held-out figures shown on the console, and the partition traffic of a trainer.

>>> format_metrics({"mrr": 0.5, "r1": 0.25, "pos_rank": 3.0})
'mrr 0.5000 r1 0.2500'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pbgio.spec.stats import EXTRA_KEY
from pbgtrain.checkpointing import iteration_keys
from pbgtrain.metrics import RankingAccumulator, RankingMetrics
from pbgtrain.model import EntityTable, StepStats
from pbgtrain.schedule.batching import IterationStep
from pbgtrain.schedule.buckets import Bucket


@dataclass
class IterationRecord:
    """What one committed iteration did."""

    version: int
    step: IterationStep
    seconds: float  # the iteration's wall time, its commit included (in a distributed run, its barriers too)
    train: StepStats
    eval_before: RankingMetrics | None = None
    eval_after: RankingMetrics | None = None
    commit_seconds: float = 0.0  # of ``seconds``, committing the version (saving what it holds, writing it)

    @property
    def training_seconds(self) -> float:
        """The iteration's time less its commit."""
        return self.seconds - self.commit_seconds

    @property
    def edges_per_second(self) -> float:
        return self.train.count / self.seconds if self.seconds > 0 else 0.0


def format_metrics(metrics: dict[str, float]) -> str:
    keys = [k for k in ("mrr", "r1", "r10", "auc", "loss") if k in metrics]
    return " ".join(f"{k} {metrics[k]:.4f}" for k in keys)


def held_out_metrics(accumulators: list[RankingAccumulator]) -> RankingMetrics | None:
    """The held-out edges of the buckets this process trained, ranked together (None without any).

    This is what the console shows (with the protocol and each side's figures); it pools the
    ranks of every held-out edge. ``training_stats.json`` keeps the original's figure instead,
    :func:`pbgtrain.checkpointing.chunk_average` of the buckets' lines (over every trainer's
    buckets in a distributed run): the same metrics, except that an average of averages may
    differ in the last digits, and in AUC when pairs were dropped.
    """
    if not accumulators:
        return None
    total = RankingAccumulator(accumulators[0].protocol)
    for acc in accumulators:
        total.merge(acc)
    return total.result()


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
        size = table.nbytes
        if saved:
            self.bytes_saved += size
            self.partitions_saved += 1
        else:
            self.bytes_loaded += size
            self.partitions_loaded += 1


def stats_line(step: IterationStep, index: int, bucket: Bucket, stats: StepStats, before: Any,
               after: Any) -> dict[str, Any]:
    """A bucket's line of training_stats.json, as the original writes it (pbgio.spec.stats);
    pbgtrain's own facts go under the sibling key ``pbgtrain``, which the original ignores."""
    count = max(stats.count, 1)
    counted = max(stats.violator_edges, 1)  # violators per edge, on the edges they were counted on
    record: dict[str, Any] = {
        "lhs_partition": bucket.lhs, "rhs_partition": bucket.rhs, "index": index,
        "stats": {"count": stats.count, "metrics": {
            "loss": stats.loss / count, "reg": stats.reg / count,
            "violators_lhs": stats.violators_lhs / counted, "violators_rhs": stats.violators_rhs / counted}},
    }
    if stats.violators_sampled:  # the attention step holds no scores: its violators are a sample's
        record[EXTRA_KEY] = {"violators_sampled_edges": stats.violator_edges}
    if before is not None:
        results = {"before": before.result(), "after": after.result()}
        for when, result in results.items():
            record[f"eval_stats_{when}"] = result.to_stats()
        record[EXTRA_KEY] = {**record.get(EXTRA_KEY, {}), "eval_protocol": results["before"].protocol.describe(),
                             **{f"eval_per_side_{when}": result.per_side_stats()
                                for when, result in results.items()}}
    return {**record, **iteration_keys(step)}
