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

:func:`scan_partitions` is the one scan of candidates partition by partition that
``pbgio neighbors`` (:mod:`pbgio.neighbors`) and ``pbgtrain predict`` (:mod:`pbgtrain.predict`:
top-k and the ranks of a triple) share: each partition is opened (read) in turn, its rows are
scored a block at a time, rows may be left out, and the best ``k`` of every query are kept with
:class:`TopK` (and, for ranks, the rows scoring at least a threshold counted).
:func:`text_table` prints results for people (``--json`` is for machines), their scores aligned
by :func:`score_column`.

>>> table = {0: np.array([0.5, 2.0, 0.25]), 1: np.array([2.0, 1.0, 3.0])}
>>> def open_partition(part):  # one query: the scores are the rows themselves
...     rows = table[part]
...     return len(rows), lambda start, stop: rows[None, start:stop]
>>> scan = scan_partitions([1, 0], open_partition, k=3, block_rows=2, exclude={1: np.array([2])},
...                        at_least=[1.0])
>>> scan.tops[0].items(), scan.candidates, scan.excluded, scan.at_least
([(2.0, 0, 1), (2.0, 1, 0), (1.0, 1, 1)], 5, 1, [3])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from pbgio.console import printable


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


BlockScores = Callable[[int, int], NDArray[Any]]
Metric = Literal["cos", "dot"]
METRICS: tuple[Metric, ...] = ("cos", "dot")
NORM_CLAMP = 1e-30
Floats = NDArray[np.float32]
"""The scores of rows ``[start, stop)`` of an open partition against every query: ``[queries, stop - start]``."""


def rows_per_block(width: int, budget: int, max_rows: int) -> int:
    """Rows scored at once so that a block holds at most ``budget`` elements of ``width`` per row
    (its dimension, or its number of queries when that is larger), at most ``max_rows``, at least 1.

    >>> [rows_per_block(width, 1 << 24, 1 << 16) for width in (100, 1 << 20, 1 << 30)]
    [65536, 16, 1]
    """
    return max(1, min(max_rows, budget // max(width, 1)))


@dataclass
class PartitionScan:
    """What :func:`scan_partitions` found.

    ``tops``: one :class:`TopK` per query (none without ``k``); ``candidates``: rows scored and
    kept (each row counts once, whatever the number of queries); ``excluded``: rows left out by
    ``exclude``; ``at_least``: per query, the kept rows scoring at least its threshold (empty
    without thresholds).
    """

    tops: list[TopK]
    candidates: int = 0
    excluded: int = 0
    at_least: list[int] = field(default_factory=list)


def scan_partitions(
    partitions: Iterable[int],
    open_partition: Callable[[int], tuple[int, BlockScores]],
    *,
    k: int | None,
    block_rows: int,
    queries: int = 1,
    exclude: Mapping[int, NDArray[Any]] | None = None,
    skip: tuple[int, int] | None = None,
    at_least: Sequence[float] | None = None,
    admitted: Mapping[int, NDArray[np.bool_]] | None = None,
) -> PartitionScan:
    """Score every row of ``partitions`` against ``queries`` queries, keeping the best ``k`` of each.

    ``open_partition(part)`` reads a partition and returns its number of rows and the scorer of
    its row blocks (:data:`BlockScores`); the partition is let go before the next is opened, so
    memory is one partition, one block of ``block_rows`` rows' scores and ``k`` per query. The
    order of ``partitions`` does not change the result (:class:`TopK`'s tie rules).

    Left out of every query's candidates: the rows ``exclude[part]`` (known edges; those inside
    the partition are counted in ``excluded``) and the row ``skip = (part, offset)`` (a triple's
    own slot; not counted). With ``at_least`` (one threshold per query), the kept rows scoring
    ``>=`` each query's threshold are counted (ties count against the query, as ranks do). With
    ``admitted`` (a candidate filter: :class:`pbgio.candidates.AdmittedRows`), only the rows
    ``admitted[part]`` marks are candidates: the others are neither scored nor counted, and
    ``excluded`` counts the known edges among the admitted rows; a block none of whose rows is
    admitted is skipped.
    """
    if at_least is not None and len(at_least) != queries:
        raise ValueError(f"expected one threshold per query ({queries}), found {len(at_least)}")
    scan = PartitionScan([TopK(k) for _ in range(queries)] if k is not None else [],
                         at_least=[0] * queries if at_least is not None else [])
    for part in partitions:
        num_rows, scores_of = open_partition(part)
        allowed = admitted.get(part) if admitted is not None else None
        drop: NDArray[np.bool_] | None = None
        if allowed is not None:  # a row the mask does not reach is not admitted
            drop = np.ones(num_rows, dtype=bool)
            drop[:len(allowed)] = ~allowed[:num_rows]
        ids = exclude.get(part) if exclude is not None else None
        if ids is not None:
            known = np.zeros(num_rows, dtype=bool)
            known[ids[ids < num_rows]] = True
            if drop is not None:
                known &= ~drop
            scan.excluded += int(known.sum())
            drop = known if drop is None else drop | known
        if skip is not None and skip[0] == part:
            drop = np.zeros(num_rows, dtype=bool) if drop is None else drop
            drop[skip[1]] = True
        for start in range(0, num_rows, block_rows):
            stop = min(start + block_rows, num_rows)
            keep = None if drop is None else ~drop[start:stop]
            if allowed is not None and keep is not None and not keep.any():
                continue  # no admitted row in the block: nothing to score
            block = scores_of(start, stop)
            offsets = np.arange(start, stop)
            if keep is not None:
                offsets = offsets[keep]
            scan.candidates += len(offsets)
            for q in range(queries):
                values = block[q] if keep is None else block[q][keep]
                if scan.tops:
                    scan.tops[q].add(values, part, offsets)
                if at_least is not None:
                    scan.at_least[q] += int(np.count_nonzero(values >= at_least[q]))
        del scores_of  # let the partition go before the next is read
    return scan


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


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[int] = ()) -> str:
    r"""Columns aligned with two spaces between them; the columns numbered in ``right`` are
    right-aligned (numbers). A plain-text result table for stdout (``--json`` is for machines):
    control characters in a cell (a name read from a file) are shown escaped
    (:func:`pbgio.console.printable`), never written to the terminal.

    >>> print(text_table(["rank", "name", "score"], [["1", "ann", "0.5"], ["10", "b\x1b]0;t\x07", "-12.25"]],
    ...                  right=[0, 2]))
    rank  name            score
       1  ann               0.5
      10  b\x1b]0;t\x07  -12.25
    """
    lines = [list(header), *([printable(cell) for cell in row] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip()
                     for line in lines)


SCORE_DIGITS = 6
"""Significant digits of the largest score of a table's column (:func:`score_column`)."""


def score_column(scores: Sequence[float], digits: int = SCORE_DIGITS) -> list[str]:
    """Scores written for one column of a :func:`text_table` (right-aligned): all with the same
    decimals, so that their decimal points line up, as many as the largest magnitude needs for
    ``digits`` significant digits. A column whose largest magnitude is under 1e-4 or at least
    1e15 is written in scientific notation, each with ``digits`` significant digits; NaN and
    infinities are written ``nan``, ``inf``, ``-inf``.

    >>> score_column([0.00246032, -0.0010851, 0.0022701])
    ['0.00246032', '-0.00108510', '0.00227010']
    >>> print(text_table(["score"], [[c] for c in score_column([12.25, 0.5, float("nan")])], right=[0]))
      score
    12.2500
     0.5000
        nan
    >>> score_column([3e-06, -1.25e-05])
    ['3.00000e-06', '-1.25000e-05']
    """
    top = max((abs(s) for s in scores if math.isfinite(s)), default=0.0)
    if top and not 1e-4 <= top < 1e15:
        return [f"{s:.{digits - 1}e}" for s in scores]
    decimals = max(0, digits - 1 - math.floor(math.log10(top))) if top else 0
    return [f"{s:.{decimals}f}" for s in scores]


def reordered(items: Sequence[tuple[float, int, int]], scores: Sequence[float]) -> list[tuple[float, int, int]]:
    """``items`` (score, partition, offset) with their scores replaced by ``scores``, best first
    by the rules of :class:`TopK` (equal scores: lower partition, then lower offset; NaN last).

    >>> reordered([(2.0, 0, 4), (1.5, 1, 0), (1.0, 0, 2)], [1.25, 1.5, 1.5])
    [(1.5, 0, 2), (1.5, 1, 0), (1.25, 0, 4)]
    """
    top = TopK(max(len(items), 1))
    for (_, part, offset), score in zip(items, scores, strict=True):
        top.add(np.array([score], np.float64), part, np.array([offset]))
    return top.items()


class VectorScorer:
    """Exact scores of queries against blocks of rows by ``cos`` or ``dot``, ``[queries, rows]``
    (float32, returned on the CPU; computed by numpy on ``cpu``, by torch on ``cuda``)."""

    def __init__(self, queries: Floats, metric: Metric, device: str) -> None:
        self.metric = metric
        self.device = device
        prepared = self._prepare_numpy(queries)
        if device == "cpu":
            self.queries: Any = prepared
        else:
            import torch

            self.queries = torch.from_numpy(prepared).to(device)

    def _prepare_numpy(self, rows: Floats) -> Floats:
        if self.metric == "dot":
            return np.ascontiguousarray(rows, np.float32)
        norms: Floats = np.linalg.norm(rows, axis=1, keepdims=True).astype(np.float32)
        return np.divide(rows, np.maximum(norms, np.float32(NORM_CLAMP)), dtype=np.float32)

    def __call__(self, rows: Floats) -> Floats:
        if self.device == "cpu":
            scores: Floats = np.asarray(self.queries @ self._prepare_numpy(rows).T, dtype=np.float32)
            return scores
        import torch

        block = torch.from_numpy(np.ascontiguousarray(rows)).to(self.device)
        if self.metric == "cos":
            block = block / block.norm(dim=1, keepdim=True).clamp_min(NORM_CLAMP)
        out: Floats = (self.queries @ block.T).cpu().numpy()
        return out


def scores_one_by_one(query: Floats, rows: Floats, metric: Metric) -> NDArray[np.float64]:
    """The score of each of ``rows`` against one ``query`` vector, each row scored alone on the
    CPU (:class:`VectorScorer`, float32): a row's score does not depend on the rows scored with it,
    so the same row gets the same score whichever search found it (a block's matrix product
    may round a score differently with other rows beside it). The scores printed by
    ``pbgio neighbors``, exact or through an index.

    >>> rows = np.array([[3.0, 4.0], [1.0, 0.0]], np.float32)
    >>> scores_one_by_one(np.array([1.0, 0.0], np.float32), rows, "cos").tolist()
    [0.6000000238418579, 1.0]
    """
    scorer = VectorScorer(np.asarray(query, np.float32).reshape(1, -1), metric, "cpu")
    return np.array([scorer(rows[i:i + 1])[0, 0] for i in range(len(rows))], np.float64)
