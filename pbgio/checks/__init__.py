"""The code of every rule of the catalogue (:mod:`pbgio.spec.rules`), each in one function.

A check is a pure function over data already read (numbers, arrays, shapes, dtypes, attribute
values, strings, a parsed config) that returns the :class:`~pbgio.errors.Issue` (or issues) of
its rule(s), ``None`` or ``[]`` when the data keep them. Who reads the data decides what
to do with them: the readers (:mod:`pbgio.edges`, :mod:`pbgio.checkpoint`,
:mod:`pbgio.entities`, :mod:`pbgio.config`, the HDF5 helpers …) raise the first issue
(:func:`raise_first`); the validator (:mod:`pbgio.validate`) collects them all. A rule's
decision and its message therefore exist once, whoever meets the problem; the meta-test
``test_every_rule_is_coded_once`` holds every rule id to one function of this package.

Layering: checks import only :mod:`pbgio.errors`, :mod:`pbgio.spec` and numpy; never a reader,
the storage layer or the validator. Files are named by the string the caller shows (a reader
its path, the validator a path relative to the validated root).

Rules decided row by row over large datasets return a :class:`RowProblem` (the rows of one
block that break the rule, and how to describe one of them), which a reader turns into the
issue of the first row (:meth:`RowProblem.first`) and the validator accumulates across blocks:

>>> import numpy as np
>>> rel = np.array([0, 7, 2, 9])
>>> bad = rel >= 3
>>> problem = RowProblem("edge-rel-range", "rel", bad, lambda i: f"expected rel < 3, found {rel[i]}")
>>> print(problem.first("edges_0_0.h5", offset=100))
edges_0_0.h5: rel: row 101 (2 rows in all): expected rel < 3, found 7 [edge-rel-range]
>>> raise_first([None, problem.first("edges_0_0.h5")])
Traceback (most recent call last):
pbgio.errors.FormatError: edges_0_0.h5: rel: row 1 (2 rows in all): expected rel < 3, found 7 [edge-rel-range]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pbgio.errors import FormatError, Issue
from pbgio.spec.rules import rule

MAX_ROWS_SHOWN = 5
"""Rows an issue lists (its ``count`` counts them all)."""


def raise_first(issues: Iterable[Issue | None], error: type[FormatError] = FormatError) -> None:
    """Raise the first issue of ``issues`` (``None`` entries are skipped) as ``error``; return
    when there is none. The fail-fast form a reader applies to what a check reports."""
    for issue in issues:
        if issue is not None:
            raise error(issue)


@dataclass
class RowProblem:
    """The rows of one block that break a rule: ``bad`` marks them, ``describe(i)`` says what
    row ``i`` of the block holds (the message of the first one becomes the issue's)."""

    rule_id: str
    dataset: str
    bad: NDArray[np.bool_]
    describe: Callable[[int], str]

    def rows(self) -> NDArray[np.intp]:
        """Indices of the offending rows within the block."""
        return np.flatnonzero(self.bad)

    def issue(self, file: str | None, message: str, rows: tuple[int, ...] = (), count: int | None = None) -> Issue:
        """The issue of this rule, for offending ``rows`` (file rows) of ``count`` in all."""
        return rule(self.rule_id).issue(file, self.dataset, message, rows=rows, count=count)

    def first(self, file: str | None, offset: int = 0) -> Issue:
        """The issue of the first offending row, the block starting at file row ``offset``."""
        i = int(self.rows()[0])
        return self.issue(file, self.describe(i), (offset + i,), int(self.bad.sum()))


def row_problem(rule_id: str, dataset: str, bad: NDArray[np.bool_],
                describe: Callable[[int], str]) -> RowProblem | None:
    """A :class:`RowProblem` when ``bad`` marks a row, else None."""
    return RowProblem(rule_id, dataset, bad, describe) if bad.any() else None


def is_int64(dtype: np.dtype[Any]) -> bool:
    """An 8-byte signed integer in either byte order (h5py converts on read)."""
    return dtype.kind == "i" and dtype.itemsize == 8


def is_float32(dtype: np.dtype[Any]) -> bool:
    """A 4-byte float in either byte order."""
    return dtype.kind == "f" and dtype.itemsize == 4
