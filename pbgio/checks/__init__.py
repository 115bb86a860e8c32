"""Rule checks, one module per artifact; :mod:`pbgio.validate` drives them.

Checks never raise for bad data: they add :class:`~pbgio.errors.Issue` objects
to a :class:`~pbgio.errors.Report`. They stream large datasets in blocks, so
memory stays bounded by a block, not by the dataset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pbgio.config import ConfigSchema
from pbgio.errors import FormatError, Issue, MissingArtifactError, Report
from pbgio.spec.rules import rule
from pbgio.storage import AnyPath, LocalCache, display, found_at

MAX_ROWS_SHOWN = 5


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

    def add(self, rule_id: str, path: AnyPath | None, dataset: str | None, message: str, *,
            rows: tuple[int, ...] = (), count: int | None = None) -> None:
        self.report.add(rule(rule_id).issue(
            None if path is None else self.display(path), dataset, message, rows=rows, count=count))

    def add_error(self, exc: FormatError | MissingArtifactError, path: AnyPath) -> None:
        """Record an error a reader raised, relocated to the displayed path."""
        if isinstance(exc, FormatError):
            issue = exc.issue
            self.report.add(Issue(issue.rule, issue.severity, self.display(path), issue.dataset,
                                  issue.message, issue.rows, issue.count))
        else:
            self.add("path-missing", path, None, f"expected this file, found {found_at(path)}")

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


class RowCollector:
    """Collects offending rows of one rule across blocks; emits one issue at the end."""

    def __init__(self, ctx: Context, rule_id: str, path: AnyPath, dataset: str) -> None:
        self.ctx, self.rule_id, self.path, self.dataset = ctx, rule_id, path, dataset
        self.rows: list[int] = []
        self.total = 0
        self.first_message: str | None = None

    def add(self, offset: int, bad: NDArray[np.bool_]) -> int | None:
        """Record the rows ``bad`` marks in a block starting at ``offset``.

        Returns the block index of the first offending row while no message has been
        set (the caller then describes it with :meth:`describe`), else None.
        """
        idx = np.flatnonzero(bad)
        if not len(idx):
            return None
        self.total += len(idx)
        if len(self.rows) < MAX_ROWS_SHOWN:
            self.rows.extend(int(offset + i) for i in idx[: MAX_ROWS_SHOWN - len(self.rows)])
        return int(idx[0]) if self.first_message is None else None

    def describe(self, message: str) -> None:
        self.first_message = message

    def flush(self) -> None:
        if self.total:
            self.ctx.add(self.rule_id, self.path, self.dataset, self.first_message or "",
                         rows=tuple(self.rows), count=self.total)
