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
from pbgio.entities import read_dynamic_rel_count, read_entity_count
from pbgio.errors import PbgioError
from pbgio.layout import Layout
from pbgio.spec.checkpoint import param_shapes

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


def _largest(cfg: ConfigSchema, counts: Counts) -> tuple[str, int] | None:
    """The partition whose rows take the most memory (None without any)."""
    def size(key: tuple[str, int]) -> int:
        return counts[key] * (4 * cfg.entity_dimension(key[0]) + ROW_STATE_BYTES)

    return max(counts, key=size, default=None)


def _rule(cfg: ConfigSchema, counts: Counts, bucket_lengths: list[int]) -> MemoryRule:
    largest = _largest(cfg, counts)
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


def available_memory() -> tuple[int, str]:
    """The bytes of memory a run may still take here, and where the figure comes from:
    ``MemAvailable`` of /proc/meminfo (else the physical memory, ``os.sysconf``), lowered to what a
    cgroup (v2) memory limit leaves.

    >>> free, source = available_memory()
    >>> free > 0 and source in ("MemAvailable", "physical memory", "the cgroup memory limit")
    True
    """
    free, source = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"
    meminfo = _proc_text("/proc/meminfo")
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:") and line.split()[1:2] and line.split()[1].isdigit():
            free, source = int(line.split()[1]) * 1024, "MemAvailable"
    limit, used = _proc_text("/sys/fs/cgroup/memory.max").strip(), _proc_text("/sys/fs/cgroup/memory.current").strip()
    if limit.isdigit() and used.isdigit() and int(limit) - int(used) < free:
        free, source = max(0, int(limit) - int(used)), "the cgroup memory limit"
    return free, source


def _proc_text(path: str) -> str:
    """A small file of the system (/proc, /sys), '' where there is none."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(1 << 16)
    except OSError:
        return ""


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


class MemoryRefusedError(PbgioError):
    """A run refused before it allocates anything: the tables and parameters its layout sizes
    (entity counts, dimensions, relation operators) take more memory than the machine has available."""


@dataclass(frozen=True)
class Need:
    """Memory a run allocates from what its layout says, in words and bytes."""

    what: str
    bytes: int


PARAMETER_BYTES = 8
"""Bytes a relation parameter or global embedding holds: its float32 value and its Adagrad sum."""
RELATION_ID_BYTES = 64
"""Bytes a run holds per dynamic relation type beside its operators' parameters: each side's id
limits of a bucket (an int64, a flag and a feature count) and its labels."""


def run_needs(cfg: ConfigSchema, counts: Counts, bucket_lengths: list[int], num_dynamic_rels: int | None, *,
              partitions_held: int | None = None) -> list[Need]:
    """What a run of ``cfg`` allocates, sized by the layout alone, largest first: the partitions the
    rule holds (``partitions_held`` of them: by default the rule's, 1 where a GPU holds them and the
    host stages one at a time), the largest bucket's edges, the relation operators (a ``linear`` one
    is dimension² parameters, a dynamic one that for every relation type) and global embeddings. The
    rule's constant (the runtime) is not among them: the process holds it already.

    >>> from pbgio.example import example_config
    >>> [(n.what.split(":")[0], n.bytes) for n in run_needs(example_config(), {("user", 0): 10**15}, [], None)][0]
    ("entity type 'user' partition 0", 152000000000000000)
    """
    rule = _rule(cfg, counts, bucket_lengths)
    held = rule.partitions_held if partitions_held is None else partitions_held
    needs = []
    largest = _largest(cfg, counts)
    if largest is not None:
        etype, part = largest
        times = f", {held} partitions of this size held" if held > 1 else ""
        needs.append(Need(f"entity type {etype!r} partition {part}: {rule.partition_rows:,} rows of dimension "
                          f"{rule.dimension:,} (embeddings and per-row state{times})", held * rule.partition_bytes))
    if rule.bucket_edges:
        needs.append(Need(f"the largest bucket: {rule.chunk_edges:,} edges held at once",
                          EDGE_BYTES * rule.chunk_edges))
    for relation in cfg.relations[:1] if cfg.dynamic_relations else cfg.relations:
        sides = (relation.lhs, relation.rhs) if cfg.dynamic_relations else (relation.rhs,)
        dimension = cfg.entity_dimension(relation.rhs)
        size = sum(math.prod(shape) for side in sides for shape in param_shapes(
            relation.operator, dimension=cfg.entity_dimension(side),
            num_dynamic_rels=(num_dynamic_rels or 0) if cfg.dynamic_relations else None).values())
        if size:
            types = f" for each of {num_dynamic_rels:,} relation types" if cfg.dynamic_relations else ""
            needs.append(Need(f"relation {relation.name!r}: operator {relation.operator!r} of dimension {dimension:,}"
                              f"{types} ({size:,} parameters)", PARAMETER_BYTES * size))
    if cfg.dynamic_relations and num_dynamic_rels:
        needs.append(Need(f"dynamic relation types: {num_dynamic_rels:,} (dynamic_rel_count.txt), each with its limits "
                          "and figures", RELATION_ID_BYTES * num_dynamic_rels))
    if cfg.global_emb:
        size = sum(cfg.entity_dimension(etype) for etype in cfg.entities)
        needs.append(Need(f"global embeddings ({size:,} parameters)", PARAMETER_BYTES * size))
    return sorted(needs, key=lambda need: -need.bytes)


def check_fits(layout: Layout, *, device_type: str = "cpu", available: tuple[int, str] | None = None) -> None:
    """Refuse a run of ``layout`` whose tables and parameters (:func:`run_needs`) exceed this machine's
    available memory (:func:`available_memory`), before anything is allocated: a
    :class:`MemoryRefusedError` naming what takes the most (an entity type, its count and dimension;
    a relation operator) and the bytes, never an allocator's traceback. A layout whose counts cannot
    be read passes: validation reports it."""
    cfg = layout.config
    try:
        counts, lengths = _sizes(layout)
        num_dynamic = read_dynamic_rel_count(layout.entity_path) if cfg.dynamic_relations else None
    except (PbgioError, OSError):
        return
    needs = run_needs(cfg, counts, lengths, num_dynamic, partitions_held=None if device_type == "cpu" else 1)
    _refuse_beyond(needs, layout.source, available, "Use more partitions (num_partitions), a smaller dimension, "
                                                    "or a machine with more memory")


def check_parameters(cfg: ConfigSchema, num_dynamic_rels: int | None, source: str, *,
                     available: tuple[int, str] | None = None) -> None:
    """Refuse to build the model of ``cfg`` (its relation operators and global embeddings, sized by
    the config's dimensions and the number of relation types) where it exceeds this machine's
    available memory: a :class:`MemoryRefusedError` naming the relation and the bytes, before the
    allocator is asked (``pbgtrain eval``, ``predict``: they build the model, then read it).

    >>> from pbgio.example import example_config
    >>> check_parameters(example_config(), None, "config.json", available=(1 << 30, "a test"))
    >>> huge = example_config().model_copy(update={"dimension": 2**40})
    >>> check_parameters(huge, None, "config.json", available=(1 << 30, "a test"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pbgio.training_memory.MemoryRefusedError: config.json: refused before allocating anything: ...
    """
    _refuse_beyond(run_needs(cfg, {}, [], num_dynamic_rels), source, available,
                   "Use a smaller dimension, or a machine with more memory")


def _refuse_beyond(needs: list[Need], source: str, available: tuple[int, str] | None, advice: str) -> None:
    total = sum(need.bytes for need in needs)
    free, where = available if available is not None else available_memory()
    if total <= free:
        return
    top = needs[0]
    raise MemoryRefusedError(
        f"{source}: refused before allocating anything: {top.what} take {_bytes(top.bytes)}; the run needs "
        f"{_bytes(total)} in all and this machine has {_bytes(free)} available ({where}). {advice}")


def _bytes(n: int) -> str:
    """``n`` bytes, exactly and in binary units.

    >>> _bytes(24 * 10**15)
    '24,000,000,000,000,000 bytes (21.3 PiB)'
    """
    units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    scaled, unit = float(n), 0
    while scaled >= 1024 and unit < len(units) - 1:
        scaled, unit = scaled / 1024, unit + 1
    return f"{n:,} bytes" + (f" ({scaled:.1f} {units[unit]})" if unit else "")


def _ordinal(n: int) -> str:
    """``20`` → ``20th``, ``2`` → ``2nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
