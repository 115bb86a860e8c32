"""What ``pbgtrain eval`` says of a ranking while it runs: its cost first, then its progress.

Before the bulk of the work, one line on stderr: the edges, the candidates each one is ranked
against and on which sides, and the time to expect, from the rate (scores a second) measured on
the first pieces of the ranking itself, :data:`PROBE_SECONDS` of it (or all of it, when it is
shorter): no work is spent on a probe, and the rate is this machine's, on this ranking. On a
terminal, a ranking expected to take :data:`LONG_RANKING_SECONDS` or more then shows a progress
bar over its edges (none with ``--no-progress`` or off a terminal). ``fit --valid`` says none of
it: its line after each validation says what was ranked and in how long.

The edges are ranked in pieces of whole steps of the plan
(:meth:`pbgtrain.ranking.EvalPlan.edges_per_step`), which gives the figures of one call for all
of them: the same batches, the same draws.

>>> work = RankingWork(edges=2_000, sampled_from=None, candidates=(6_004, 6_004), scores=(12_008, 12_008),
...                    sides=("lhs", "rhs"))
>>> said, expected = work.line(rate=2.0e7, measured=500).split(": ")
>>> said
'ranking 2,000 edges × 6,004 candidates, both sides (24.0M scores)'
>>> expected
'expected 1.2 s at 20.0M scores/s (measured on the first 500)'
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

PROBE_SECONDS = 0.25
"""The first seconds of a ranking whose rate gives the time to expect of all of it."""
LONG_RANKING_SECONDS = 5.0
"""A ranking expected to take this long or more shows a progress bar (on a terminal)."""


def edges_ranked(count: int, sampled_from: int | None) -> str:
    """What a ranking ranked: its edges, or the sample of them.

    >>> edges_ranked(40, None), edges_ranked(500, 3_034)
    ('40 edges', 'a sample of 500 of 3,034 edges')
    """
    return f"{count:,} edges" if sampled_from is None else f"a sample of {count:,} of {sampled_from:,} edges"


def amount(value: float) -> str:
    """A large count in three figures: ``950``, ``12.3K``, ``48.0M``, ``1.2G``, ``3.4T``.

    >>> amount(950), amount(12_345), amount(48e6), amount(1.2e9), amount(3.4e12)
    ('950', '12.3K', '48.0M', '1.2G', '3.4T')
    """
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def duration(seconds: float) -> str:
    """A time to expect, in the unit that reads best.

    >>> duration(0.04), duration(7.25), duration(42), duration(415), duration(9_000)
    ('0.0 s', '7.2 s', '42 s', '6.9 min', '2.5 h')
    """
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _span(low: float, high: float, show: Callable[[float], str]) -> str:
    return show(low) if show(low) == show(high) else f"{show(low)}–{show(high)}"


@dataclass(frozen=True)
class RankingWork:
    """What a ranking will compute: its edges (a sample of ``sampled_from``, or all), the candidates
    of an edge on one side (fewest, most: partitions and relations may differ), the scores of an
    edge over its sides (fewest, most), and the sides ranked."""

    edges: int
    sampled_from: int | None
    candidates: tuple[int, int]
    scores: tuple[int, int]
    sides: tuple[str, ...]

    def line(self, rate: float, measured: int) -> str:
        """The line said before the bulk of the ranking: the work and the time to expect at ``rate``
        (scores a second, measured on the first ``measured`` edges); when those were all of them (a
        ranking shorter than the probe), the time it took.

        >>> work = RankingWork(40, None, (10, 40), (50, 80), ("lhs", "rhs"))
        >>> print(work.line(rate=1e3, measured=40))
        ranked 40 edges × 10–40 candidates, both sides (2.0K–3.2K scores) in 2.0 s–3.2 s: 1.0K scores/s
        """
        sides = "both sides" if len(self.sides) == 2 else f"{self.sides[0]} side only" if self.sides else "no side"
        low, high = (self.edges * per_edge for per_edge in self.scores)
        what = (f"{edges_ranked(self.edges, self.sampled_from)} × {_span(*self.candidates, lambda n: f'{n:,.0f}')} "
                f"candidates, {sides} ({_span(low, high, amount)} scores)")
        time_taken = _span(low / rate, high / rate, duration)
        if measured >= self.edges:
            return f"ranked {what} in {time_taken}: {amount(rate)} scores/s"
        return f"ranking {what}: expected {time_taken} at {amount(rate)} scores/s (measured on the first {measured:,})"


class RankingWatch:
    """Says nothing and shows nothing: ranks (``fit --valid``, the Python API). A context manager:
    what a watch shows ends with it."""

    def __enter__(self) -> RankingWatch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(finished=exc_type is None)

    def start(self, work: Callable[[], RankingWork]) -> None:
        """A ranking begins (again, when the version changed under it); ``work()`` says what it computes
        (asked only by a watch that says it)."""

    def rank(self, rank: Callable[[Any], None], sel: Any, step: int, scores_per_edge: int) -> None:
        """``rank(sel)``: rank the edges ``sel`` (pieces of ``step`` edges each make the same figures),
        each edge computing ``scores_per_edge`` scores."""
        rank(sel)

    def close(self, finished: bool = True) -> None:
        """The ranking is over (``finished``: done; else stopped by an error)."""


class SpokenWatch(RankingWatch):
    """Says the cost line (through ``say``), and with ``interactive`` shows a bar on a long ranking."""

    bar: Any  # the progress bar shown (pbgio.progress.RichProgress), or None

    def __init__(self, say: Callable[[str], None], interactive: bool) -> None:
        self.say = say
        self.interactive = interactive
        self.shown = contextlib.ExitStack()  # the bar, while one is shown
        self._reset(None)

    def start(self, work: Callable[[], RankingWork]) -> None:
        self._reset(work())

    def _reset(self, work: RankingWork | None) -> None:
        self.shown.close()
        self.work, self.bar, self.said = work, None, False
        self.probe_edges, self.probe_scores, self.probe_seconds = 0, 0, 0.0  # ranked before the line is said

    def rank(self, rank: Callable[[Any], None], sel: Any, step: int, scores_per_edge: int) -> None:
        for begin in range(0, len(sel), step):
            piece = sel[begin:begin + step]
            started = time.perf_counter()
            rank(piece)
            if self.bar is not None:
                self.bar.advance(len(piece))
            elif not self.said:
                self.probe_edges += len(piece)
                self.probe_scores += len(piece) * scores_per_edge
                self.probe_seconds += time.perf_counter() - started
                if self.probe_seconds >= PROBE_SECONDS and self.probe_scores:
                    self._say()

    def close(self, finished: bool = True) -> None:
        if finished and not self.said and self.probe_scores:
            self._say()  # a ranking shorter than the probe: said with the rate of all of it
        self._reset(None)

    def _say(self) -> None:
        from pbgio.progress import RichProgress

        self.said = True
        if self.work is None:
            return
        rate = self.probe_scores / max(self.probe_seconds, 1e-9)
        self.say(self.work.line(rate, self.probe_edges))
        expected = self.work.edges * self.work.scores[1] / rate
        if self.interactive and expected >= LONG_RANKING_SECONDS and self.probe_edges < self.work.edges:
            self.bar = self.shown.enter_context(RichProgress())
            self.bar.start("ranking edges", total=self.work.edges)
            self.bar.advance(self.probe_edges)


def ranking_work(edges: int, sampled_from: int | None, per_side: Sequence[Sequence[int]],
                 sides: Sequence[str]) -> RankingWork:
    """The :class:`RankingWork` of ``edges`` whose candidates on each side ranked are one of
    ``per_side`` (one list a relation and bucket: the candidates on each of its sides).

    >>> ranking_work(100, None, [[40, 40], [40, 10]], ("lhs", "rhs")).candidates
    (10, 40)
    """
    counts = [n for each in per_side for n in each] or [0]
    totals = [sum(each) for each in per_side] or [0]
    return RankingWork(edges, sampled_from, (min(counts), max(counts)), (min(totals), max(totals)), tuple(sides))
