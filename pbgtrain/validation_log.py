"""The records of ``pbgtrain fit --valid`` in ``training_stats.json``, read back.

Each evaluation of a version on the validation edges is one line of ``training_stats.json`` whose
``pbgtrain`` key (:data:`pbgio.spec.stats.EXTRA_KEY`) holds ``{"validation": record}``: the
version, the validation ``edge_path``, the ``protocol``, ``count`` and ``metrics``, the
``decision`` taken, and the state after it (``best_version``, ``best_mrr``, ``since_best``,
``since_change``, ``lr_scale``). :mod:`pbgtrain.early_stopping` writes them and reads them back when a
run resumes; ``pbgtrain report`` draws them. Reading needs only the standard library (``report``
starts without torch).

>>> line = {"index": 3, "pbgtrain": {"validation": {"version": 2, "edge_path": "valid", "decision": "best"}}}
>>> [r["version"] for r in validation_records([line], "valid", committed=2)]
[2]
>>> validation_records([line], "valid", committed=1)  # a version a crash left uncommitted
[]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pbgio.spec.stats import EXTRA_KEY

RECORD_KEY = "validation"
"""The key of a validation line's record under ``training_stats.json``'s ``pbgtrain`` key."""

STOP_PREFIX = "stop:"
"""How a decision that stopped the run says so: one of its ``"; "``-separated parts starts with it."""


def validation_records(lines: Iterable[Mapping[str, Any]], edge_path: str | None,
                       committed: int) -> list[dict[str, Any]]:
    """The validation records of ``training_stats.json`` lines on ``edge_path`` (None: on any) for
    versions up to ``committed`` (lines of a version a crash left uncommitted are not the run's
    history), in the order written."""
    out = []
    for line in lines:
        extra = line.get(EXTRA_KEY)
        rec = extra.get(RECORD_KEY) if isinstance(extra, dict) else None
        if not isinstance(rec, dict) or not isinstance(rec.get("version"), int) or rec["version"] > committed:
            continue
        if edge_path is None or rec.get("edge_path") == edge_path:
            out.append(rec)
    return out


def decision_stopped(decision: str) -> bool:
    """Whether a record's ``decision`` stopped the run (patience ran out).

    >>> decision_stopped("no improvement; stop: 3 evaluation(s) without improvement (patience 3)")
    True
    >>> decision_stopped("no improvement; learning rate × 0.5")
    False
    """
    return any(part.startswith(STOP_PREFIX) for part in decision.split("; "))
