"""``training_stats.json``: the learning curve, one JSON object per line, appended as training goes.

The original replays every line when it resumes (``TrainingCoordinator.train``): it reads
``index`` and hands each stats object it finds to ``Stats.from_dict``, which accepts exactly
the keys ``count`` and ``metrics``. Anything else a trainer wants to record goes into sibling
keys of the line, which the original ignores; pbgtrain puts its own under :data:`EXTRA_KEY`.

The rules of a line are :func:`pbgio.checks.checkpoint.stats_line`; what a stats object must be:

>>> stats_object_problem("stats", {"count": 10, "metrics": {"loss": 0.5}}) is None
True
>>> stats_object_problem("eval_stats_after", {"count": 10, "metrics": {}, "protocol": "raw"})
"expected eval_stats_after to hold exactly the keys count and metrics, found also 'protocol'"
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

STATS_OBJECT_KEYS = ("count", "metrics")
EXTRA_KEY = "pbgtrain"


@dataclass(frozen=True)
class LineKey:
    """A key of a stats line: ``int``, or ``stats`` (a ``{count, metrics}`` object)."""

    name: str
    kind: str
    meaning: str


LINE_KEYS: tuple[LineKey, ...] = (
    LineKey("lhs_partition", "int", "lhs partition of the bucket (bucket lines)"),
    LineKey("rhs_partition", "int", "rhs partition of the bucket (bucket lines)"),
    LineKey("index", "int", "required: position in the learning curve; a bucket line has "
            "iteration × buckets per iteration + the bucket's rank in its pass, the iteration's "
            "average line the iteration's last position"),
    LineKey("stats", "stats", "training: loss, reg, violators_lhs, violators_rhs, averaged per edge"),
    LineKey("eval_stats_before", "stats", "held-out edges before training on the bucket: loss, pos_rank, "
            "mrr, r1, r10, r50, auc (pbgtrain adds r3)"),
    LineKey("eval_stats_after", "stats", "the same after training on the bucket"),
    LineKey("eval_stats_chunk_avg", "stats", "one line per iteration with held-out edges: the "
            "count-weighted average of its buckets' eval_stats_before"),
    LineKey("epoch_idx", "int", "epoch of the iteration, 0-based"),
    LineKey("edge_path_idx", "int", "edge path of the iteration, 0-based"),
    LineKey("edge_chunk_idx", "int", "edge chunk of the iteration, 0-based"),
)
STATS_KEYS = tuple(key.name for key in LINE_KEYS if key.kind == "stats")
EXTRA_MEANING = ("pbgtrain's own facts, ignored by the original: `eval_protocol` (how the held-out "
                 "edges were ranked), `eval_per_side_before` / `eval_per_side_after` (the metrics of "
                 "each side, as `{count, metrics}`), and on bucket lines `rank` (the trainer that trained "
                 "the bucket; 0 in a single-process run) with `trained_from` / `trained_until` (its "
                 "wall-clock training window, Unix seconds) and, where the step never held the scores "
                 "(`fit --step attention`), `violators_sampled_edges` (the edges its violators were counted "
                 "on, a sample: `violators_lhs`/`_rhs` are per edge of that sample); on the line of an "
                 "evaluation of `fit --valid`, "
                 "`validation` (the version, the validation edge path, protocol, `count`, `metrics`, "
                 "`seconds` it took, with `--valid-sample` `sample` (`{edges, of}`: the sample ranked and the "
                 "edges it was drawn from), the `decision` taken and the state after it: `best_version`, "
                 "`best_mrr`, `since_best`, `since_change`, `lr_scale`); on the line a `fit` appends when it "
                 "ends, `run` (`from_version`, `version`, `end`: completed, time cap, iteration cap, patience "
                 "or interrupted, `reason` in words, and `seconds`: `training`, `validation` with `validations`, "
                 "`checkpointing`, `total`)")


def is_int(value: Any) -> bool:
    """An integer of JSON (not a bool, which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isnan(value))


def stats_object_problem(name: str, value: Any) -> str | None:
    """Why ``value`` is not a stats object the original's ``Stats.from_dict`` accepts, or None."""
    if not isinstance(value, dict):
        return f"expected {name} to be an object {{count, metrics}}, found {type(value).__name__}"
    missing = [k for k in STATS_OBJECT_KEYS if k not in value]
    extra = [k for k in value if k not in STATS_OBJECT_KEYS]
    if missing or extra:
        found = (f"missing {', '.join(map(repr, missing))}" if missing else "") + (
            "; " if missing and extra else "") + (f"also {', '.join(map(repr, extra))}" if extra else "")
        return f"expected {name} to hold exactly the keys count and metrics, found {found}"
    if not (is_int(value["count"]) and value["count"] >= 0):
        return f"expected {name}.count to be an integer ≥ 0, found {value['count']!r}"
    metrics = value["metrics"]
    if not isinstance(metrics, dict):
        return f"expected {name}.metrics to be an object of numbers, found {type(metrics).__name__}"
    bad = next((k for k, v in metrics.items() if not _is_number(v)), None)
    if bad is not None:
        return f"expected {name}.metrics to hold numbers, found {bad} = {metrics[bad]!r}"
    return None
