"""How much host memory ``pbgtrain fit`` holds on a CPU, and how many partitions a graph needs.

Partitioned training holds, at any time, the two partitions of the current bucket (the lhs and
the rhs one; one when they are the same) with their per-row state, the bucket's edges (one edge
chunk of it), and a constant: the Python and torch runtime, the model's relation parameters and
the step's workspace. Every other partition lives in its checkpoint file. So on a CPU (where
``--partition-memory`` is 0 and the next bucket is not read ahead) the peak resident memory is

    2 × (largest partition's rows × (4·dimension + ROW_STATE_BYTES))      (1 × when nothing is partitioned)
    + EDGE_BYTES × (largest bucket's edges ÷ num_edge_chunks)
    + CONSTANT_BYTES

and a graph of N rows (its largest type) in P partitions of E edges needs the smallest P for which
``2·(N/P)·row + EDGE_BYTES·E/(P²·chunks) + CONSTANT_BYTES`` fits the machine's memory
(:func:`partitions_needed`). ``pbgio info`` and the first line of ``pbgtrain fit`` state it;
docs/guides/scaling.md gives the measurements the constants come from.

>>> rule = MemoryRule(partition_rows=2_685_898, dimension=100, bucket_edges=1_328_623, edge_chunks=20)
>>> print(rule.describe())  # doctest: +NORMALIZE_WHITESPACE
training holds ≈ 2.8 GiB: 2 partitions × 1.03 GiB (2,685,898 rows: embeddings and per-row state)
+ 0.00 GiB of edges (66,432 of the largest bucket's 1,328,623, a 20th) + 0.75 GiB
>>> [partitions_needed(rows=86_054_151, dimension=100, edges=338_586_276, memory_gib=m) for m in (16, 24, 64)]
[5, 4, 1]
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from pbgio.config import ConfigSchema
from pbgio.edges import bucket_length, iter_buckets
from pbgio.entities import read_entity_count
from pbgio.layout import Layout

GIB = 1 << 30
ROW_STATE_BYTES = 12
"""Bytes a row holds beside its embedding while its partition trains: the row's Adagrad sum
(float32) and the trainer's map from row to its position in a batch (int64)."""
EDGE_BYTES = 48
"""Bytes an edge of the current bucket holds while it trains: lhs, rhs and relation (int64 each) and
the shuffled copy of them a pass reads."""
CONSTANT_BYTES = 768 << 20
"""The runtime, the relation parameters and the step's workspace (batch 10,000, 1,000 negatives;
measured: docs/guides/scaling.md)."""
MAX_PARTITIONS = 1 << 16


@dataclass(frozen=True)
class MemoryRule:
    """The host memory of a CPU training run, by the rule of this module."""

    partition_rows: int  # rows of the largest partition (any entity type)
    dimension: int  # of that partition's type
    bucket_edges: int  # edges of the largest bucket
    edge_chunks: int = 1  # num_edge_chunks: a pass holds one chunk of a bucket
    partitions_held: int = 2  # the lhs and the rhs partition of a bucket; 1 when no type is partitioned

    @property
    def partition_bytes(self) -> int:
        return self.partition_rows * (4 * self.dimension + ROW_STATE_BYTES)

    @property
    def chunk_edges(self) -> int:
        return math.ceil(self.bucket_edges / max(1, self.edge_chunks))

    @property
    def total_bytes(self) -> int:
        return self.partitions_held * self.partition_bytes + EDGE_BYTES * self.chunk_edges + CONSTANT_BYTES

    def describe(self) -> str:
        share = f", a {_ordinal(self.edge_chunks)}" if self.edge_chunks > 1 else ""
        held = f"{self.partitions_held} partitions ×" if self.partitions_held > 1 else "1 partition of"
        return (f"training holds ≈ {self.total_bytes / GIB:.1f} GiB: {held} "
                f"{self.partition_bytes / GIB:.2f} GiB ({self.partition_rows:,} rows: embeddings and per-row state) "
                f"+ {EDGE_BYTES * self.chunk_edges / GIB:.2f} GiB of edges ({self.chunk_edges:,} of the largest "
                f"bucket's {self.bucket_edges:,}{share}) + {CONSTANT_BYTES / GIB:.2f} GiB")


def memory_rule(layout: Layout) -> MemoryRule:
    """The rule's figures for ``layout``: its largest partition (entity counts) and its largest
    bucket (the edge paths' bucket files), read without reading any table or edge."""
    return _rule(layout.config, *_sizes(layout))


Counts = dict[tuple[str, int], int]
"""Rows by (entity type, partition)."""


def _sizes(layout: Layout) -> tuple[Counts, list[int]]:
    """Every partition's row count and every bucket's edge count (of every edge path), read once."""
    cfg = layout.config
    counts = {(name, part): read_entity_count(layout.entity_path, name, part)
              for name, entity in cfg.entities.items() for part in range(entity.num_partitions)}
    lengths = [bucket_length(file) for path in layout.edge_paths if path.is_dir() for _, _, file in iter_buckets(path)]
    return counts, lengths


def _rule(cfg: ConfigSchema, counts: Counts, bucket_lengths: list[int]) -> MemoryRule:
    def size(key: tuple[str, int]) -> int:
        return counts[key] * (4 * cfg.entity_dimension(key[0]) + ROW_STATE_BYTES)

    largest = max(counts, key=size, default=None)
    rows, dimension = (counts[largest], cfg.entity_dimension(largest[0])) if largest else (0, cfg.dimension)
    held = 2 if any(entity.num_partitions > 1 for entity in cfg.entities.values()) else 1
    return MemoryRule(rows, dimension, max(bucket_lengths, default=0), cfg.num_edge_chunks or 1, held)


def partitions_needed(*, rows: int, dimension: int, edges: int, memory_gib: float, edge_chunks: int = 1) -> int:
    """The fewest partitions with which a type of ``rows`` rows and a graph of ``edges`` edges
    (spread evenly over P² buckets) train within ``memory_gib`` GiB by the rule; ValueError when
    even :data:`MAX_PARTITIONS` do not fit (the constant alone may not).

    >>> partitions_needed(rows=86_054_151, dimension=100, edges=338_586_276, memory_gib=8)
    10
    """
    budget = memory_gib * GIB
    for parts in range(1, MAX_PARTITIONS + 1):
        rule = MemoryRule(math.ceil(rows / parts), dimension, math.ceil(edges / parts**2), edge_chunks, min(2, parts))
        if rule.total_bytes <= budget:
            return parts
    raise ValueError(f"{rows:,} rows of dimension {dimension} do not train in {memory_gib:g} GiB with up to "
                     f"{MAX_PARTITIONS:,} partitions (the rule's constant alone is {CONSTANT_BYTES / GIB:.2f} GiB)")


def machine_memory_gib() -> float:
    """This machine's physical memory in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def summary(layout: Layout) -> dict[str, object]:
    """The rule for ``layout`` as ``pbgio info`` and ``pbgtrain fit`` state it: its figures, its line,
    and the partitions this machine's memory needs for the largest entity type and every edge."""
    cfg, memory = layout.config, machine_memory_gib()
    counts, lengths = _sizes(layout)
    rule = _rule(cfg, counts, lengths)
    rows = {name: sum(counts[name, p] for p in range(e.num_partitions)) for name, e in cfg.entities.items()}
    largest = max(rows, key=lambda name: rows[name] * cfg.entity_dimension(name))
    try:
        needed: int | None = partitions_needed(rows=rows[largest], dimension=cfg.entity_dimension(largest),
                                               edges=sum(lengths), memory_gib=memory,
                                               edge_chunks=rule.edge_chunks)
    except ValueError:
        needed = None
    fits = "does not fit" if needed is None else f"needs {needed} partition{'s' if needed != 1 else ''} of {largest!r}"
    return {"bytes": rule.total_bytes, "partition_bytes": rule.partition_bytes,
            "edge_bytes": EDGE_BYTES * rule.chunk_edges, "constant_bytes": CONSTANT_BYTES,
            "machine_gib": round(memory, 1), "partitions_needed": needed,
            "line": f"{rule.describe()}; this machine's {memory:.0f} GiB {fits} (docs/guides/scaling.md)"}


def _ordinal(n: int) -> str:
    """``20`` → ``20th``, ``2`` → ``2nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
