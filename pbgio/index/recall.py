"""The recall an approximate index's build measures, and the search setting it raises to reach a target.

Rows of the table drawn at random are the queries (:data:`RECALL_QUERIES`); their exact top
:data:`~pbgio.spec.index.RECALL_K` among all the other rows (every row scored, by the index's
metric: :class:`ExactTop`, fed the rows as the build adds them, so it reads nothing more) is the
truth. The index then answers them as a search does: it proposes
:data:`~pbgio.index.search.DEFAULT_CANDIDATES` rows per query, which a search scores exactly, so
the search finds exactly those of the true top 10 that are among them: recall@10 is their share
(:func:`recall_at_k`). :func:`tune` raises ``nprobe`` (ivf) or ``ef_search`` (hnsw), doubling it,
until that recall reaches :data:`RECALL_TARGET`.

>>> rng = np.random.default_rng(0)
>>> rows = rng.standard_normal((50, 4)).astype(np.float32)
>>> exact = ExactTop(rows[[3, 7]], np.array([3, 7]), k=2)
>>> for start in range(0, 50, 16):  # the rows as the build adds them, a chunk at a time
...     exact.add(rows[start:start + 16])
>>> truth = exact.truth()
>>> [sorted(t) == sorted([r for r in np.argsort(-(rows @ rows[q])) if r != q][:2]) for q, t in zip([3, 7], truth)]
[True, True]
>>> recall_at_k(np.array([[truth[0][0], 3], [truth[1][0], truth[1][1]]]), truth)
0.75
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pbgio.index import library
from pbgio.spec.index import RECALL_K, RECALL_TARGET

RECALL_QUERIES = 500
"""Rows drawn as queries to measure recall (all of them in a smaller table): 5,000 neighbours
compared, so a recall of .95 is known to about ±.01."""
MAX_EF_SEARCH = 2048
"""The largest ``ef_search`` :func:`tune` tries."""
SCORE_BUDGET = 1 << 22
"""Scores (queries × rows) computed at once by :class:`ExactTop`: 16 MiB of float32."""

Floats = NDArray[np.float32]
Ids = NDArray[np.int64]


class ExactTop:
    """The exact top ``k`` of each query among the rows of a table (the query's own row, ``ids``,
    left out), fed the table's rows in order, prepared for the metric, a chunk at a time."""

    def __init__(self, queries: Floats, ids: Ids, k: int = RECALL_K) -> None:
        self.queries = np.ascontiguousarray(queries, dtype=np.float32)
        self.ids = np.asarray(ids, dtype=np.int64)
        self.k = k
        self.scores = np.full((len(queries), k), -np.inf, np.float32)
        self.found = np.full((len(queries), k), -1, np.int64)
        self.seen = 0
        self.seconds = 0.0

    def add(self, rows: Floats) -> None:
        """Score the table's next rows against every query and keep each query's best ``k``."""
        started = time.perf_counter()
        step = max(1, SCORE_BUDGET // max(len(self.queries), 1))
        for start in range(0, len(rows), step):
            block = rows[start:start + step]
            first = self.seen + start
            scores = self.queries @ block.T
            scores[np.isnan(scores)] = -np.inf  # a row of NaN is nobody's neighbour
            own = self.ids - first
            mine = np.flatnonzero((own >= 0) & (own < len(block)))
            scores[mine, own[mine]] = -np.inf
            take = min(self.k, len(block))
            best = np.argpartition(-scores, take - 1, axis=1)[:, :take]
            joined = np.concatenate([self.scores, np.take_along_axis(scores, best, axis=1)], axis=1)
            ids = np.concatenate([self.found, best + first], axis=1)
            keep = np.argpartition(-joined, self.k - 1, axis=1)[:, :self.k]
            self.scores = np.take_along_axis(joined, keep, axis=1)
            self.found = np.take_along_axis(ids, keep, axis=1)
        self.seen += len(rows)
        self.seconds += time.perf_counter() - started

    def truth(self) -> list[Ids]:
        """Each query's exact top ``k`` (row ids; fewer where the table has fewer other rows)."""
        return [found[scores > -np.inf] for found, scores in zip(self.found, self.scores, strict=True)]


def recall_at_k(proposed: Ids, truth: list[Ids]) -> float:
    """The share of the true neighbours (``truth``) among the rows proposed (``[queries, count]``;
    -1: none); 1.0 when there are none to find."""
    wanted = sum(len(t) for t in truth)
    if wanted == 0:
        return 1.0
    return sum(int(np.isin(t, row).sum()) for t, row in zip(truth, proposed, strict=True)) / wanted


@dataclass(frozen=True)
class Tuning:
    """What :func:`tune` measured: the search parameter raised (``nprobe`` or ``ef_search``), the
    recall at each value tried, in order, and the value chosen (the last tried)."""

    param: str
    tried: list[tuple[int, float]]
    queries: int
    candidates: int
    seconds: float
    reached: bool
    """Whether the chosen value reaches :data:`RECALL_TARGET` (or was given, not raised)."""

    @property
    def value(self) -> int:
        return self.tried[-1][0]

    @property
    def recall(self) -> float:
        return self.tried[-1][1]

    def steps(self) -> str:
        """``nprobe 16: 0.912, 32: 0.968``."""
        return f"{self.param} " + ", ".join(f"{value}: {recall:.3f}" for value, recall in self.tried)


def tune(index: Any, kind: str, params: dict[str, int], queries: Floats, truth: list[Ids], candidates: int, *,
         fixed: bool, max_share: float | None) -> Tuning:
    """Measure recall@10 at ``params``; unless ``fixed`` (the value was given), double ``nprobe``
    or ``ef_search`` until it reaches :data:`RECALL_TARGET` or its cap: ``nlist``, or with
    ``max_share`` that share of it (for ``auto``: beyond it, a flat index is as cheap); for hnsw
    :data:`MAX_EF_SEARCH`. Nothing is tried when the value given already exceeds the cap."""
    started = time.perf_counter()
    param = "nprobe" if kind == "ivf" else "ef_search"
    value = params[param]
    if kind == "ivf":
        cap = params["nlist"] if max_share is None else int(max_share * params["nlist"])
    else:
        cap = max(MAX_EF_SEARCH, value)
    tried: list[tuple[int, float]] = []
    while fixed or value <= cap:
        proposed = library.search(index, queries, candidates, kind, {**params, param: value})
        tried.append((value, recall_at_k(proposed, truth)))
        if fixed or tried[-1][1] >= RECALL_TARGET or value >= cap:
            break
        value = min(2 * value, cap)
    reached = bool(tried) and (fixed or tried[-1][1] >= RECALL_TARGET)
    return Tuning(param, tried, len(queries), candidates, time.perf_counter() - started, reached)
