"""Asking an index for rows until enough of them pass a filter.

An index proposes rows in its own (approximate) order without knowing which ones a search may
keep: a candidate filter (:class:`pbgio.candidates.AdmittedRows`), the known edges of
``predict --filter``, the query itself. :func:`widened_proposals` asks first for the rows a
search would take were every row kept, divided by the share of rows the filter admits; while
fewer than ``need`` of a query's proposals pass, it asks again for :data:`GROWTH` times as many,
until enough pass or the index has no more to give (it returned fewer rows than asked, or was
asked for all of its rows). Each query gets a :class:`Widened`: the rows that passed, in the
index's order, and how far the search went, which :meth:`Widened.shortfall` turns into a
sentence when fewer than ``need`` passed.

>>> rows = np.arange(10)
>>> def propose(queries, count):  # an index of 10 rows in one partition, best first
...     found = np.full((len(queries), count), -1)
...     found[:, :min(count, 10)] = rows[:count]
...     return np.where(found >= 0, 0, -1), found
>>> def passes(query, parts, offsets):  # the odd rows
...     return offsets % 2 == 1
>>> [w] = widened_proposals(propose, passes, 1, need=3, start=2, limit=10)
>>> w.offsets.tolist(), w.asked, w.rounds, w.complete
([1, 3, 5, 7], 8, 2, True)
>>> [w] = widened_proposals(propose, passes, 1, need=6, start=2, limit=10)
>>> w.complete
False
>>> print(w.shortfall(6, "neighbours"))
only 5 of 6 neighbours pass the filter among the 10 rows the index proposed (asked for 10 in 3 rounds: all its rows)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

GROWTH = 4
"""How many times more rows each new round asks the index for."""

Ids = NDArray[np.int64]
Propose = Callable[[NDArray[np.intp], int], tuple[Ids, Ids]]
"""``propose(queries, count)``: ``(partitions, offsets)`` ``[len(queries), count]`` of the rows
the index proposes for those queries (their numbers), -1 where it has fewer."""
Passes = Callable[[int, Ids, Ids], NDArray[np.bool_]]
"""``passes(query, partitions, offsets)``: which of a query's proposed rows a search may keep."""


@dataclass(frozen=True)
class Widened:
    """One query's proposals that passed, in the index's order, and how far the search went:
    ``asked`` rows asked for in the last of ``rounds`` rounds, ``proposed`` rows the index gave
    then; ``exhausted`` when it could give no more (fewer than asked, or all its ``limit`` rows
    asked for)."""

    partitions: Ids
    offsets: Ids
    need: int
    asked: int
    proposed: int
    rounds: int
    exhausted: bool
    limit: int

    @property
    def passed(self) -> int:
        """Proposed rows that passed."""
        return len(self.offsets)

    @property
    def complete(self) -> bool:
        """Whether at least ``need`` rows passed."""
        return self.passed >= self.need

    def shortfall(self, k: int, what: str) -> str:
        """Why fewer than ``k`` ``what`` were found: how many passed, how far the index was asked."""
        why = "all its rows" if self.proposed >= self.limit else "all it could propose at its search settings"
        return (f"only {self.passed:,} of {k:,} {what} pass the filter among the {self.proposed:,} rows the index "
                f"proposed (asked for {self.asked:,} in {self.rounds} round{'s' if self.rounds != 1 else ''}: {why})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the rows asked for and proposed in the last round, the rounds, how many passed."""
        return {"asked": self.asked, "proposed": self.proposed, "rounds": self.rounds, "passed": self.passed,
                "complete": self.complete}


def first_request(rows_wanted: int, share: float) -> int:
    """The rows to ask an index for first, so that about ``rows_wanted`` pass a filter that
    admits ``share`` of the rows.

    >>> first_request(100, 1.0), first_request(100, 0.01), first_request(11, 0.3)
    (100, 10000, 37)
    """
    return max(rows_wanted, int(np.ceil(rows_wanted / max(share, 1e-12))))


def widened_proposals(propose: Propose, passes: Passes, queries: int, *, need: int, start: int,
                      limit: int) -> list[Widened]:
    """Each query's proposals that pass, asking for ``start`` rows first, then :data:`GROWTH`
    times more while fewer than ``need`` pass and the index has more to give (``limit``: the
    index's rows, the most worth asking for)."""
    found: list[Widened | None] = [None] * queries
    pending = np.arange(queries)
    count, rounds = start, 0
    while len(pending):
        rounds += 1
        parts, offsets = propose(pending, count)
        still = []
        for j, query in enumerate(pending):
            given = parts[j] >= 0
            keep = given.copy()
            keep[given] = passes(int(query), parts[j][given], offsets[j][given])
            proposed = int(given.sum())
            exhausted = proposed < count or count >= limit
            if int(keep.sum()) >= need or exhausted:
                found[query] = Widened(parts[j][keep], offsets[j][keep], need, count, proposed, rounds, exhausted,
                                       limit)
            else:
                still.append(query)
        pending = np.array(still, dtype=np.intp)
        count = min(limit, count * GROWTH)
    return [w for w in found if w is not None]
