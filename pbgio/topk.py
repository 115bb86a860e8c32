"""Exact top-k over scores that arrive a block at a time (partitions, row blocks of a partition).

:class:`TopK` keeps the ``k`` best ``(score, partition, offset)`` seen so far: memory is the
block being added plus ``k``, however many rows are scored. Higher scores rank first; equal
scores rank by (partition, offset), so the result does not depend on the order blocks come in
or on how rows are split into blocks. A NaN score ranks below every other score.

>>> top = TopK(3)
>>> top.add(np.array([0.5, 2.0, 0.25], np.float32), 0, np.arange(3))
>>> top.add(np.array([2.0, 1.0]), 1, np.array([7, 8]))
>>> top.items()
[(2.0, 0, 1), (2.0, 1, 7), (1.0, 1, 8)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray


class TopK:
    """The ``k`` best scored rows seen so far, best first."""

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"expected k >= 1, found {k}")
        self.k = k
        self.scores: NDArray[np.float64] = np.zeros(0, np.float64)
        self.partitions: NDArray[np.int64] = np.zeros(0, np.int64)
        self.offsets: NDArray[np.int64] = np.zeros(0, np.int64)

    def add(self, scores: NDArray[Any], partition: int, offsets: NDArray[Any]) -> None:
        """Offer rows ``offsets`` of ``partition`` with their ``scores`` (1-D, same length)."""
        values = np.asarray(scores, dtype=np.float64).reshape(-1)
        rows = np.asarray(offsets, dtype=np.int64).reshape(-1)
        if len(values) != len(rows):
            raise ValueError(f"expected as many scores as offsets, found {len(values)} and {len(rows)}")
        if len(values) > self.k:  # the block's k best, ties at the threshold included
            key = np.where(np.isnan(values), -np.inf, values)
            threshold = np.partition(key, len(key) - self.k)[len(key) - self.k]
            keep = np.flatnonzero(key >= threshold)
            values, rows = values[keep], rows[keep]
        scores_all = np.concatenate([self.scores, values])
        parts_all = np.concatenate([self.partitions, np.full(len(values), partition, np.int64)])
        offsets_all = np.concatenate([self.offsets, rows])
        key_all = np.where(np.isnan(scores_all), -np.inf, scores_all)
        order = np.lexsort((offsets_all, parts_all, -key_all))[:self.k]
        self.scores, self.partitions, self.offsets = scores_all[order], parts_all[order], offsets_all[order]

    def items(self) -> list[tuple[float, int, int]]:
        """``(score, partition, offset)`` of the best rows, best first (at most ``k``)."""
        return [(float(s), int(p), int(o)) for s, p, o in
                zip(self.scores, self.partitions, self.offsets, strict=True)]

    def __len__(self) -> int:
        return len(self.scores)


def finite_or_none(value: float) -> float | None:
    """``value``, or None for NaN and infinities (JSON has no place for them)."""
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class RankedEntity:
    """One entity of a top-k result: its rank (from 1), name, score and place (partition, row offset)."""

    rank: int
    name: str
    score: float
    partition: int
    offset: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (a non-finite score is null)."""
        return {"rank": self.rank, "name": self.name, "score": finite_or_none(self.score),
                "partition": self.partition, "offset": self.offset}
