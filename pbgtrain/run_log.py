"""How each ``pbgtrain fit`` ended and where its time went: its record in ``training_stats.json``, read back.

A fit that committed at least one version appends one line when it ends, whose ``pbgtrain`` key
(:data:`pbgio.spec.stats.EXTRA_KEY`) holds ``{"run": record}``: the versions it started from and
ended at (``from_version``, ``version``), how it ended (``end``: one of :data:`ENDS`, with
``reason`` in words) and its time in seconds (``seconds``: ``training``, the iterations less
their commits; ``validation``, the evaluations of ``--valid``, with their number ``validations``;
``checkpointing``, the commits; ``total``, from its first iteration to its end). The original
ignores the line; ``pbgtrain report`` reads it (the standard library only: ``report`` starts
without torch).

>>> line = {"index": 3, "pbgtrain": {"run": {"version": 2, "end": "time cap", "reason": "…"}}}
>>> [r["end"] for r in run_records([line], committed=2)], run_records([line], committed=1)
(['time cap'], [])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pbgio.spec.stats import EXTRA_KEY

RUN_KEY = "run"
"""The key of a run's record under ``training_stats.json``'s ``pbgtrain`` key."""

COMPLETED, TIME_CAP, ITERATION_CAP, PATIENCE, INTERRUPTED = \
    "completed", "time cap", "iteration cap", "patience", "interrupted"
ENDS = (COMPLETED, TIME_CAP, ITERATION_CAP, PATIENCE, INTERRUPTED)
"""How a run ends: the end of its plan, ``--max-minutes``, ``--max-iterations``, ``--patience``, Ctrl-C."""


@dataclass
class RunTimes:
    """Where a run's time went, in seconds (see the module doc).

    >>> print(RunTimes(training=402.0, validation=598.4, validations=6, checkpointing=12.3, total=1023.0).line())
    time: training 402.0 s, validation 598.4 s (6 evaluations), checkpointing 12.3 s; 1023.0 s in all
    """

    training: float = 0.0
    validation: float = 0.0
    validations: int = 0
    checkpointing: float = 0.0
    total: float = 0.0

    def line(self) -> str:
        validation = f"validation {self.validation:.1f} s ({self.validations} evaluation" \
                     f"{'' if self.validations == 1 else 's'})"
        return (f"time: training {self.training:.1f} s, {validation}, checkpointing {self.checkpointing:.1f} s; "
                f"{self.total:.1f} s in all")

    def to_record(self) -> dict[str, Any]:
        return {"training": round(self.training, 3), "validation": round(self.validation, 3),
                "validations": self.validations, "checkpointing": round(self.checkpointing, 3),
                "total": round(self.total, 3)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RunTimes:
        """The times of a record's ``seconds`` (a missing or odd figure counts 0)."""
        seconds = record.get("seconds")
        seconds = seconds if isinstance(seconds, dict) else {}

        def number(key: str) -> float:
            value = seconds.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0

        return cls(number("training"), number("validation"), int(number("validations")), number("checkpointing"),
                   number("total"))

    def __add__(self, other: RunTimes) -> RunTimes:
        return RunTimes(self.training + other.training, self.validation + other.validation,
                        self.validations + other.validations, self.checkpointing + other.checkpointing,
                        self.total + other.total)


def run_records(lines: Iterable[Mapping[str, Any]], committed: int) -> list[dict[str, Any]]:
    """The run records of ``training_stats.json`` lines that end at a version up to ``committed``,
    in the order written."""
    out = []
    for line in lines:
        extra = line.get(EXTRA_KEY)
        rec = extra.get(RUN_KEY) if isinstance(extra, dict) else None
        if isinstance(rec, dict) and isinstance(rec.get("version"), int) and rec["version"] <= committed:
            out.append(rec)
    return out
