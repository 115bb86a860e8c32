"""What a run's ``training_stats.json`` says, per iteration and per validation (the standard library only).

Each iteration becomes one :class:`IterationPoint` (an edge chunk of an edge path of an epoch,
which commits one checkpoint version, so iteration N counted from 1 is checkpoint version N); a
bucket line belongs to iteration ``index // buckets_per_iteration`` (:mod:`pbgio.spec.stats`):

* **loss**: the buckets' training loss per edge, averaged weighted by their edge counts, and the
  held-out loss the same way;
* **held-out metrics** (MRR, Hits@k, AUC): the buckets' ``eval_stats_after``, averaged weighted
  by their held-out edge counts: the figures ``pbgtrain fit`` prints after each iteration;
* **edges/s**: the iteration's training edges over its wall-clock window, from its first
  bucket's ``trained_from`` to its last bucket's ``trained_until`` (pbgtrain's extras; lines the
  original wrote have no times).

When an iteration was trained again (a crash between its stats and its commit repeats its
lines), the lines of the last attempt replace the earlier ones.

Each evaluation of ``pbgtrain fit --valid`` becomes one :class:`ValidationPoint`
(:mod:`pbgtrain.validation_log`): the version's filtered metrics on the validation edges and
what was decided (best, learning rate decayed, stop).

>>> line = {"index": 0, "lhs_partition": 0, "rhs_partition": 0, "stats": {"count": 10, "metrics": {"loss": 2.0}},
...         "pbgtrain": {"trained_from": 100.0, "trained_until": 102.0}}
>>> [(p.iteration, p.edges, p.loss, p.edges_per_second) for p in iteration_points([line], 1)]
[(0, 10, 2.0, 5.0)]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pbgio.spec.stats import EXTRA_KEY
from pbgtrain.validation_log import decision_stopped, validation_records


@dataclass(frozen=True)
class IterationPoint:
    """What the stats say about one iteration."""

    iteration: int  # 0-based position in the training plan; checkpoint version iteration + 1
    epoch_idx: int | None
    edge_path_idx: int | None
    edge_chunk_idx: int | None
    edges: int  # training edges of its buckets
    loss: float | None  # training loss per edge
    held_out: Mapping[str, float]  # held-out metrics after each bucket, loss included
    held_out_edges: int
    seconds: float | None  # wall-clock window of its buckets (None: not recorded)

    @property
    def number(self) -> int:
        """The iteration counted from 1: the checkpoint version it commits."""
        return self.iteration + 1

    @property
    def edges_per_second(self) -> float | None:
        """Training edges over the wall-clock window of the buckets (None: no times recorded)."""
        if self.seconds is None or self.seconds <= 0 or self.edges == 0:
            return None
        return self.edges / self.seconds


def _bucket_key(line: Mapping[str, Any]) -> object:
    lhs, rhs = line.get("lhs_partition"), line.get("rhs_partition")
    return (lhs, rhs) if lhs is not None and rhs is not None else ("index", line["index"])


def _weighted(pairs: Iterable[tuple[int, float]]) -> float | None:
    pairs = [(count, value) for count, value in pairs if count > 0]
    total = sum(count for count, _ in pairs)
    return sum(count * value for count, value in pairs) / total if total else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _point(iteration: int, lines: Sequence[Mapping[str, Any]]) -> IterationPoint:
    trained = [(line["stats"]["count"], line["stats"]["metrics"]) for line in lines]
    held_out = [(line["eval_stats_after"]["count"], line["eval_stats_after"]["metrics"])
                for line in lines if "eval_stats_after" in line]
    names = list(dict.fromkeys(name for _, metrics in held_out for name in metrics))
    averaged = {name: _weighted((count, metrics[name]) for count, metrics in held_out if name in metrics)
                for name in names}
    extras = [line[EXTRA_KEY] for line in lines if isinstance(line.get(EXTRA_KEY), dict)]
    starts = [t for t in (_number(extra.get("trained_from")) for extra in extras) if t is not None]
    ends = [t for t in (_number(extra.get("trained_until")) for extra in extras) if t is not None]
    first = lines[0]
    return IterationPoint(
        iteration=iteration, epoch_idx=first.get("epoch_idx"), edge_path_idx=first.get("edge_path_idx"),
        edge_chunk_idx=first.get("edge_chunk_idx"), edges=sum(count for count, _ in trained),
        loss=_weighted((count, metrics["loss"]) for count, metrics in trained if "loss" in metrics),
        held_out={name: value for name, value in averaged.items() if value is not None},
        held_out_edges=sum(count for count, _ in held_out),
        seconds=max(ends) - min(starts) if len(starts) == len(ends) == len(lines) else None)


def iteration_points(records: Iterable[Mapping[str, Any]], buckets_per_iteration: int) -> list[IterationPoint]:
    """One point per iteration with a bucket line (a line holding ``stats``), in training order.

    ``records`` are the lines of ``training_stats.json``; ``buckets_per_iteration`` is the
    config's lhs × rhs partitions. Lines without ``stats`` (the original's per-iteration
    ``eval_stats_chunk_avg`` line, pbgtrain's validation lines) add nothing: the held-out figures
    come from the buckets.
    """
    if buckets_per_iteration < 1:
        raise ValueError(f"expected buckets_per_iteration >= 1, found {buckets_per_iteration}")
    attempts: dict[int, dict[object, Mapping[str, Any]]] = {}  # iteration -> its last attempt's lines by bucket
    for line in records:
        if "stats" not in line:
            continue
        iteration = line["index"] // buckets_per_iteration
        attempt = attempts.setdefault(iteration, {})
        key = _bucket_key(line)
        if key in attempt:  # the iteration was trained again: its last attempt counts
            attempt = attempts[iteration] = {}
        attempt[key] = line
    return [_point(iteration, list(attempts[iteration].values())) for iteration in sorted(attempts)]


def eval_protocol(records: Iterable[Mapping[str, Any]]) -> str | None:
    """How the held-out edges were ranked, as pbgtrain recorded it (the last line saying so)."""
    found = None
    for line in records:
        extra = line.get(EXTRA_KEY)
        if isinstance(extra, dict) and isinstance(extra.get("eval_protocol"), str):
            found = extra["eval_protocol"]
    return found


@dataclass(frozen=True)
class ValidationPoint:
    """One evaluation of ``fit --valid``: a version ranked on the validation edges, and what it decided."""

    version: int
    edge_path: str
    protocol: str | None
    count: int  # validation edges ranked
    metrics: Mapping[str, float]  # mrr, r1, r10 … (filtered)
    decision: str  # in words, as fit printed it
    best_version: int  # the best version after this evaluation
    lr_scale: float  # the learning rates' scale after this evaluation

    @property
    def stopped(self) -> bool:
        """Patience ran out: the run stopped after this evaluation."""
        return decision_stopped(self.decision)


def _validation_point(record: Mapping[str, Any]) -> ValidationPoint:
    metrics = record.get("metrics")
    numbers = {name: value for name, value in (metrics.items() if isinstance(metrics, dict) else ())
               if _number(value) is not None}
    protocol, decision = record.get("protocol"), record.get("decision")
    best, scale, count = record.get("best_version"), _number(record.get("lr_scale")), record.get("count")
    return ValidationPoint(
        version=record["version"], edge_path=str(record.get("edge_path")),
        protocol=protocol if isinstance(protocol, str) else None,
        count=count if isinstance(count, int) else 0, metrics=numbers,
        decision=decision if isinstance(decision, str) else "",
        best_version=best if isinstance(best, int) else 0, lr_scale=1.0 if scale is None else scale)


def validation_points(records: Iterable[Mapping[str, Any]], committed: int) -> list[ValidationPoint]:
    """The evaluations of ``fit --valid`` on the validation edge path evaluated last, of versions up
    to ``committed``, one per version (a version evaluated again: its later record), by version."""
    found = validation_records(records, None, committed)
    if not found:
        return []
    edge_path = found[-1].get("edge_path")
    by_version = {record["version"]: _validation_point(record) for record in found
                  if record.get("edge_path") == edge_path}
    return [by_version[version] for version in sorted(by_version)]


def best_evaluation(evaluations: Sequence[ValidationPoint]) -> ValidationPoint | None:
    """The evaluation of the best version as the last one records it (None: none, or its MRR
    was not recorded)."""
    if not evaluations:
        return None
    best_version = evaluations[-1].best_version
    return next((e for e in evaluations if e.version == best_version and "mrr" in e.metrics), None)
