"""What an import did: per file, per bucket, per entity type, and a one-line summary.

Every input row is counted once, as one of:

- **kept**: written to a bucket;
- **skipped**: malformed (only with ``on_error="skip"``; the default fails on the first one);
- **filtered**: well-formed, but its relation or one of its entities (for a featurized
  entity: all of its features) fell below a minimum count.

>>> report = ImportReport(config="c.json", entity_path="data", dynamic=False, seed=0, seconds=2.0)
>>> report.files.append(FileReport("train.tsv", "data/train", rows=10, malformed=1, kept=8))
>>> report.buckets["data/train"] = {"0_0": 8}
>>> print(report.summary())
read 10 edges from 1 file in 2.00 s (5 edges/s): kept 8, skipped 1 malformed, filtered 1 by minimum counts
>>> report.bucket_lines()
['data/train: 8 edges in 1 bucket (0_0: 8)']
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

BUCKETS_LISTED = 16


@dataclass(frozen=True)
class Problem:
    """One malformed row (or an empty file), located by file and line (or row)."""

    file: str
    line: int
    message: str
    unit: str = "line"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.unit == "line" else f"{self.file}: {self.unit} {self.line}"
        return f"{where}: {self.message}"


@dataclass
class FileReport:
    path: str
    edge_path: str
    rows: int = 0  # data rows read: header and empty lines are not rows
    malformed: int = 0
    kept: int = 0
    problems: list[Problem] = field(default_factory=list)  # the first few

    @property
    def filtered(self) -> int:
        return self.rows - self.malformed - self.kept


@dataclass
class AppendInfo:
    """What an append (``pbgio import --append``) changed, beside what :class:`ImportReport` holds.

    ``before``: entities per partition before the append; ``new``: the new entities per
    partition (``ImportReport.entities`` holds the counts after); ``known``: distinct names of
    the inputs that were known already; ``added``: edges added per edge path and bucket
    (``ImportReport.buckets`` holds the totals after).
    """

    before: dict[str, list[int]] = field(default_factory=dict)
    new: dict[str, list[int]] = field(default_factory=dict)
    known: dict[str, int] = field(default_factory=dict)
    relation_types_before: int = 0
    added: dict[str, dict[str, int]] = field(default_factory=dict)
    dry_run: bool = False


@dataclass
class ImportReport:
    config: str | None
    entity_path: str
    dynamic: bool
    seed: int
    seconds: float = 0.0
    files: list[FileReport] = field(default_factory=list)
    buckets: dict[str, dict[str, int]] = field(default_factory=dict)  # edge path -> "L_R" -> edges
    entities: dict[str, list[int]] = field(default_factory=dict)  # type -> count per partition
    featurized: list[str] = field(default_factory=list)
    relation_types: int = 0
    warnings: list[str] = field(default_factory=list)
    append: AppendInfo | None = None

    @property
    def read(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def kept(self) -> int:
        return sum(f.kept for f in self.files)

    @property
    def skipped(self) -> int:
        return sum(f.malformed for f in self.files)

    @property
    def filtered(self) -> int:
        return sum(f.filtered for f in self.files)

    @property
    def edges_per_second(self) -> float:
        return self.read / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        files = len(self.files)
        plural = "s" if files != 1 else ""
        dry = "dry run, nothing written: " if self.append is not None and self.append.dry_run else ""
        return (f"{dry}read {self.read:,} edges from {files} file{plural} in {self.seconds:.2f} s "
                f"({_rate(self.edges_per_second)} edges/s): kept {self.kept:,}, skipped {self.skipped:,} "
                f"malformed, filtered {self.filtered:,} by minimum counts")

    def entity_line(self) -> str:
        if self.append is not None:
            return self._append_entity_line(self.append)
        parts = []
        for name, counts in self.entities.items():
            what = "features" if name in self.featurized else "entities"
            split = f" in {len(counts)} partitions" if len(counts) > 1 else ""
            parts.append(f"{name}: {sum(counts):,} {what}{split}")
        return "; ".join(parts) + f"; {_count(self.relation_types, 'relation type')}"

    def _append_entity_line(self, info: AppendInfo) -> str:
        parts = []
        for name, counts in self.entities.items():
            new = info.new.get(name, [])
            split = f" (partitions: {', '.join(f'+{n:,}' for n in new)})" if len(new) > 1 else ""
            parts.append(f"{name}: {info.known.get(name, 0):,} known, {_count(sum(new), 'new entity', 'new entities')}"
                         f"{split}, {sum(counts):,} in all")
        new_rels = self.relation_types - info.relation_types_before
        return "; ".join(parts) + f"; {_count(self.relation_types, 'relation type')} ({new_rels:,} new)"

    def bucket_lines(self) -> list[str]:
        if self.append is not None:
            return self._append_bucket_lines(self.append)
        lines = []
        for edge_path, buckets in self.buckets.items():
            total = sum(buckets.values())
            n = len(buckets)
            head = f"{edge_path}: {_count(total, 'edge')} in {_count(n, 'bucket')}"
            if n <= BUCKETS_LISTED:
                detail = ", ".join(f"{k}: {v:,}" for k, v in buckets.items())
            else:
                values = list(buckets.values())
                detail = (f"min {min(values):,}, max {max(values):,}, "
                          f"{sum(v == 0 for v in values)} empty")
            lines.append(f"{head} ({detail})")
        return lines

    def _append_bucket_lines(self, info: AppendInfo) -> list[str]:
        lines = []
        for edge_path, added in info.added.items():
            totals = self.buckets.get(edge_path, {})
            n = len(added)
            head = (f"{edge_path}: {_count(sum(added.values()), 'edge')} added to {_count(n, 'bucket')}, "
                    f"{sum(totals.values()):,} in all")
            if n <= BUCKETS_LISTED:
                detail = ", ".join(f"{k}: +{v:,}" for k, v in added.items())
            else:
                values = list(added.values())
                detail = f"min +{min(values):,}, max +{max(values):,}, {sum(v == 0 for v in values)} unchanged"
            lines.append(f"{head} ({detail})")
        return lines

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for f, d in zip(self.files, data["files"], strict=True):
            d["filtered"] = f.filtered
        data.update(read=self.read, kept=self.kept, skipped=self.skipped, filtered=self.filtered,
                    edges_per_second=round(self.edges_per_second, 1))
        return data


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def _rate(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:.0f}"
