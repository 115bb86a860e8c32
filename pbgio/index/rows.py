"""The rows an exact scan scores, block by block, from a table that streams by in chunks.

:func:`pbgio.topk.scan_partitions` asks for a partition's rows a block at a time, in order
(``[0, b)``, ``[b, 2b)`` …); :meth:`pbgio.checkpoint.CheckpointDir.iter_embedding_rows` reads a
partition a bounded chunk at a time (``PBG_ROW_CHUNK_BYTES``). :class:`RowWindow` joins the two:
memory holds the chunks a block spans, never the partition, and a block holds the rows it would
hold were the partition read whole, whatever the chunks' size, so every score is the same. The
exact scans of ``pbgio neighbors`` and ``pbgtrain predict`` read their candidates through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

Rows = NDArray[Any]


class RowWindow:
    """Rows ``[start, stop)`` of a table whose ``(first row, rows)`` chunks come in order, asked
    for in ranges that never go back (each range starts at or after the previous one's start).

    >>> chunks = iter([(0, np.arange(3)), (3, np.arange(3, 5)), (5, np.arange(5, 9))])
    >>> window = RowWindow(chunks)
    >>> window(0, 2).tolist(), window(2, 6).tolist(), window(6, 9).tolist()
    ([0, 1], [2, 3, 4, 5], [6, 7, 8])
    >>> window(1, 2)
    Traceback (most recent call last):
    ValueError: rows from 1 asked for after rows from 6: a window never goes back
    """

    def __init__(self, chunks: Iterator[tuple[int, Rows]]) -> None:
        self._chunks = chunks
        self._held: list[tuple[int, Rows]] = []  # the chunks from the last range's start on
        self._start = 0
        self._end = 0  # the end of the last chunk read

    def __call__(self, start: int, stop: int) -> Rows:
        if start < self._start:
            raise ValueError(f"rows from {start} asked for after rows from {self._start}: a window never goes back")
        self._start = start
        while self._end < stop:
            self._read_chunk(stop)
        self._held = [(first, rows) for first, rows in self._held if first + len(rows) > start]
        pieces = [rows[max(start - first, 0):stop - first] for first, rows in self._held if first < stop]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _read_chunk(self, stop: int) -> None:
        chunk = next(self._chunks, None)
        if chunk is None:
            raise ValueError(f"rows up to {stop} asked for, beyond the table's {self._end}")
        self._held.append(chunk)
        self._end = chunk[0] + len(chunk[1])
