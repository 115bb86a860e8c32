"""What the validator knows about the layout it walks, and where it collects the issues."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from pbgio.checks import MAX_ROWS_SHOWN, RowProblem
from pbgio.checks.layout import path_missing
from pbgio.errors import FormatError, Issue, MissingArtifactError, Report
from pbgio.spec.config import ConfigSchema
from pbgio.storage import AnyPath, LocalCache, display, found_at

K = TypeVar("K")


@dataclass
class Context:
    """What the checks know about the layout being validated."""

    report: Report
    root: AnyPath | None = None
    config: ConfigSchema | None = None
    counts: dict[tuple[str, int], int] = field(default_factory=dict)
    dynamic_rel_count: int | None = None
    cache: LocalCache | None = None
    """Where remote buckets are read from when set: whole local copies (a trainer validates into
    the cache it then trains from), instead of ranged reads."""
    warm_start: bool = False
    """True while an ``init_path`` is checked: its tables may have fewer rows than the entity
    counts, and its dynamic relation operators fewer relations (a warm start grows them)."""
    _buffers: dict[tuple[str, str], NDArray[Any]] = field(default_factory=dict, repr=False)
    _recorded: set[Issue] = field(default_factory=set, repr=False)

    def buffer(self, slot: str, size: int, dtype: np.dtype[Any]) -> NDArray[Any]:
        """A reusable read buffer: fresh large allocations cost a page-zeroing pass each."""
        key = (slot, dtype.str)
        buf = self._buffers.get(key)
        if buf is None or len(buf) < size:
            buf = self._buffers[key] = np.empty(size, dtype=dtype)
        return buf[:size]

    def display(self, path: AnyPath) -> str:
        """``path`` as shown in issues: relative to the validated root when inside it."""
        if self.root is not None and type(path) is type(self.root):
            try:
                return path.relative_to(self.root).as_posix()  # type: ignore[arg-type]
            except ValueError:
                pass
        return display(path)

    def add(self, issue: Issue | None) -> None:
        """Record what a check reported (nothing for None, nor an issue already recorded: a link out of
        the layout is found by the scan of its directory and again by the reader of the file)."""
        if issue is not None and issue not in self._recorded:
            self._recorded.add(issue)
            self.report.add(issue)

    def extend(self, issues: Iterable[Issue | None]) -> None:
        for issue in issues:
            self.add(issue)

    def add_at(self, issue: Issue, path: AnyPath) -> None:
        """Record ``issue`` (of another file name, or none) as an issue of ``path``."""
        self.add(Issue(issue.rule, issue.severity, self.display(path), issue.dataset,
                       issue.message, issue.rows, issue.count))

    def add_error(self, exc: FormatError | MissingArtifactError, path: AnyPath) -> None:
        """Record an error a reader raised, relocated to the displayed path."""
        if isinstance(exc, FormatError):
            self.add_at(exc.issue, path)
        else:
            self.add(path_missing(self.display(path), f"expected this file, found {found_at(path)}"))

    def count(self, entity_type: str, part: int) -> int | None:
        """Entity count of a type in a bucket partition (unpartitioned types use part 0)."""
        if self.config is not None and self.config.entities[entity_type].num_partitions == 1:
            part = 0
        return self.counts.get((entity_type, part))

    @property
    def num_relations(self) -> int | None:
        if self.config is None:
            return None
        if self.config.dynamic_relations:
            return self.dynamic_rel_count
        return len(self.config.relations)


def absent(expected: Iterable[K], present: Collection[K], expected_total: int, is_expected: Callable[[K], bool],
           shown: int = MAX_ROWS_SHOWN) -> tuple[list[K], int]:
    """The first ``shown`` keys of ``expected`` (in its order) that ``present`` lacks, and how many of
    the ``expected_total`` keys it lacks in all, found from what is on disk: the work is bounded by
    ``len(present) + shown`` however many keys a config expects (``num_partitions: 10**7``, P² buckets),
    never by their number. ``is_expected`` says whether a present key is one of them.

    >>> absent(iter(range(10**12)), {0, 1, 3, 10**13}, 10**12, lambda k: k < 10**12, shown=3)
    ([2, 4, 5], 999999999997)
    """
    total = expected_total - sum(1 for key in present if is_expected(key))
    first: list[K] = []
    if total > 0:
        for key in expected:  # each key skipped is a present one: at most len(present) of them
            if key not in present:
                first.append(key)
                if len(first) >= min(shown, total):
                    break
    return first, total


class RowCollector:
    """Collects the offending rows of one rule (on one dataset) across blocks; one issue at the end."""

    def __init__(self, ctx: Context, path: AnyPath) -> None:
        self.ctx, self.path = ctx, path
        self.rows: list[int] = []
        self.total = 0
        self.problem: RowProblem | None = None
        self.first_message = ""

    def add(self, offset: int, problem: RowProblem | None) -> None:
        """Record the rows of a block starting at file row ``offset`` that break ``problem``'s rule."""
        if problem is None:
            return
        idx = problem.rows()
        if not len(idx):
            return
        if self.problem is None:  # described now: the block's buffers are reused for the next one
            self.problem, self.first_message = problem, problem.describe(int(idx[0]))
        self.total += len(idx)
        if len(self.rows) < MAX_ROWS_SHOWN:
            self.rows.extend(int(offset + i) for i in idx[: MAX_ROWS_SHOWN - len(self.rows)])

    def flush(self) -> None:
        if self.problem is not None and self.total:
            self.ctx.add(self.problem.issue(self.ctx.display(self.path), self.first_message,
                                            tuple(self.rows), self.total))
