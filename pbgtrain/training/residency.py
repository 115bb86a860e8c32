"""Where partitions live between buckets, and what is read ahead: :class:`PartitionStore`.

The original swaps every partition a bucket no longer needs out to disk and reads the next one
back. :class:`PartitionCache` keeps swapped-out partitions in memory instead, on the training
device (GPU memory when training on CUDA), up to a byte budget: a partition that fits is parked
and taken back at no cost; one that does not is saved into the version being built, as before.
Parked partitions are written when the iteration commits, so what is on disk, and when, is the
same as without the cache (a crash loses only the uncommitted iteration, as always).

:class:`Prefetcher` overlaps the next bucket's input with the current bucket's training (double
buffering): a background thread reads the next bucket's edges (and checks their ids) and the
partitions it will load from disk, into pinned host memory when the device is a GPU, so that the
copy to the device is asynchronous.

>>> from pbgtrain.model import EntityTable
>>> cache = PartitionCache(budget_bytes=10_000)
>>> cache.park(("node", 1), EntityTable.random(10, 4))
True
>>> cache.park(("node", 2), EntityTable.random(1000, 4))  # 16 kB of weights: over the budget
False
>>> cache.take(("node", 1)).num_entities, cache.take(("node", 1))
(10, None)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from pbgio.config import ConfigSchema
from pbgio.confinement import inherited
from pbgtrain.checkpointing import TrainingCheckpoint
from pbgtrain.model import EntityTable, release_freed_memory
from pbgtrain.schedule.batching import IterationStep
from pbgtrain.schedule.buckets import Bucket, BucketScheduler, PartitionKey, PartitionSides, plan_swap
from pbgtrain.training.records import MovementStats

GIB = 1 << 30
DEVICE_HEADROOM = 0.25
"""Share of a GPU's free memory left to the step's working set when the cache budget is automatic."""


def partition_bytes(count: int, dimension: int) -> int:
    """Bytes of one partition on the device: float32 embeddings and one Adagrad sum per row."""
    return count * (dimension + 1) * 4


def default_budget(device: torch.device, reserved: int) -> int:
    """Bytes of parked partitions allowed when the user sets none: on a GPU, what it has free
    beyond :data:`DEVICE_HEADROOM` and ``reserved`` (the largest bucket's partitions and the
    unpartitioned tables, which are loaded besides: all partitions stay on the GPU when they fit);
    on a CPU, 0 (the original's bounded memory: only the current bucket's partitions in memory)."""
    if device.type != "cuda":
        return 0
    free, _ = torch.cuda.mem_get_info(device)
    return max(0, int(free * (1 - DEVICE_HEADROOM)) - reserved)


class PartitionCache:
    """Swapped-out partitions kept in memory, up to ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._parked: dict[PartitionKey, EntityTable] = {}
        self.bytes = 0
        self.hits = 0

    def park(self, key: PartitionKey, table: EntityTable) -> bool:
        """Keep ``table`` if it fits in the budget (True); False: the caller saves it."""
        size = table.nbytes
        if self.bytes + size > self.budget_bytes:
            return False
        self._parked[key] = table
        self.bytes += size
        return True

    def take(self, key: PartitionKey) -> EntityTable | None:
        """The parked table of ``key`` (no longer parked), or None."""
        table = self._parked.pop(key, None)
        if table is not None:
            self.bytes -= table.nbytes
            self.hits += 1
        return table

    def __contains__(self, key: object) -> bool:
        return key in self._parked

    def items(self) -> Iterator[tuple[PartitionKey, EntityTable]]:
        return iter(list(self._parked.items()))


class Prefetcher:
    """Reads ahead on one background thread; results are taken by key (each at most once)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pbgtrain-prefetch")
        self._pending: dict[Any, Future[Any]] = {}

    def submit(self, key: Any, read: Callable[[], Any]) -> None:
        if key not in self._pending:
            self._pending[key] = self._pool.submit(inherited(read))  # the command's scope, on the reading thread

    def take(self, key: Any) -> Any | None:
        """The result read ahead for ``key`` (its error raised here), or None when none was asked."""
        future = self._pending.pop(key, None)
        return None if future is None else future.result()

    def discard(self) -> None:
        """Forget everything read ahead (waiting for reads in flight, ignoring their errors)."""
        for future in self._pending.values():
            future.exception()
        self._pending.clear()

    def close(self) -> None:
        self.discard()
        self._pool.shutdown(wait=True)


def pinned(table: EntityTable, device: torch.device) -> EntityTable:
    """``table`` (on the CPU) in page-locked memory when ``device`` is a GPU, else as is."""
    if device.type != "cuda":
        return table
    return EntityTable(table.weights.pin_memory(), table.adagrad_sum.pin_memory(), entity_type=table.entity_type,
                       partition=table.partition)


def to_device(table: EntityTable, device: torch.device) -> EntityTable:
    """``table`` on ``device`` (asynchronous from pinned memory)."""
    if table.device == device:
        return table
    return EntityTable(table.weights.to(device, non_blocking=True), table.adagrad_sum.to(device, non_blocking=True),
                       entity_type=table.entity_type, partition=table.partition)


def bucket_bytes(config: ConfigSchema, layout: PartitionSides, counts: Mapping[PartitionKey, int]) -> int:
    """Device bytes of the most a bucket holds: the largest partition of each type on each side,
    and the unpartitioned tables."""
    def largest(etype: str) -> int:
        return max(partition_bytes(count, config.entity_dimension(t)) for (t, _), count in counts.items()
                   if t == etype)

    sides = [*layout.lhs_types, *layout.rhs_types, *layout.unpartitioned]
    return sum(largest(etype) for etype in sides if any(t == etype for t, _ in counts))


class PartitionStore:
    """The partitions of one trainer and every move they make.

    Resident (on the training device): the current bucket's partitions and the unpartitioned
    types. Swapped out: parked in memory within ``budget_bytes`` (:class:`PartitionCache`; a
    single process only, a distributed run passes 0) until the commit writes them, else saved at
    once into the version being built and handed back to the scheduler (another trainer may take
    them now). Read ahead (``read_ahead``, on a GPU by default): the partitions the next bucket will
    load from disk, on the :class:`Prefetcher`'s thread, into pinned host memory. Every byte saved
    and loaded is counted in ``movement``.
    """

    def __init__(self, checkpoint: TrainingCheckpoint, layout: PartitionSides, counts: Mapping[PartitionKey, int],
                 device: torch.device, scheduler: BucketScheduler, prefetcher: Prefetcher, movement: MovementStats, *,
                 budget_bytes: int, read_ahead: bool) -> None:
        self.ckpt = checkpoint
        self.layout = layout
        self.counts = counts
        self.device = device
        self.scheduler = scheduler
        self.prefetcher = prefetcher
        self.movement = movement
        self.cache = PartitionCache(budget_bytes)
        self.read_ahead_partitions = read_ahead
        self.resident: dict[PartitionKey, EntityTable] = {}
        self.load_unpartitioned()  # part of the shared state, which the coordinator agrees on at the start

    def table(self, entity_type: str, bucket: Bucket, side: str) -> EntityTable:
        return self.resident[(entity_type, self.layout.partition_of(entity_type, bucket, side))]

    def swap_to(self, bucket: Bucket | None, step: IterationStep) -> None:
        """Make exactly ``bucket``'s partitions resident (none for None), plus the unpartitioned
        types: evicted partitions are parked while the budget allows, else saved into the version
        being built, and handed back to the scheduler; loads come from the cache, from what was
        read ahead, or from disk."""
        started = time.perf_counter()
        swap = plan_swap(self.resident, bucket, self.layout)
        for key in swap.evict:
            self._evict(key, step)
        self.scheduler.hand_back(swap.evict)
        if swap.evict and self.device.type == "cpu":
            release_freed_memory()  # the evicted tables' pages, before the next ones are read
        for key in swap.load:
            parked = self.cache.take(key)
            if parked is not None:
                self.resident[key] = parked
                continue
            ahead = self.prefetcher.take(("partition", step.index, key))
            loaded = to_device(ahead, self.device) if ahead is not None else \
                self.ckpt.load(key[0], key[1], self.counts[key])
            self.movement.add_table(loaded, saved=False)
            self.movement.partitions_read_ahead += ahead is not None
            self.resident[key] = loaded
        self.load_unpartitioned()
        self.movement.seconds_swapping += time.perf_counter() - started

    def _evict(self, key: PartitionKey, step: IterationStep) -> None:
        """Park or save a resident partition; no reference to it outlives the call, so that its
        memory is free (and given back, on a CPU) before the next partitions are read."""
        table = self.resident.pop(key)
        if key in self.ckpt.written or not self.cache.park(key, table):
            self.ckpt.save(key[0], key[1], table, step.info())
            self.movement.add_table(table, saved=True)

    def read_ahead(self, upcoming: Bucket, step: IterationStep) -> None:
        """Start reading the partitions ``upcoming`` will load from disk (those neither resident nor
        parked), when reading ahead. On a CPU partitions are not read ahead by default: that would
        hold a bucket's partitions twice, and the original's bound on memory (the current bucket's
        partitions) is what users partition for."""
        if not self.read_ahead_partitions:
            return
        for key in plan_swap(self.resident, upcoming, self.layout).load:
            if key not in self.cache:
                self.prefetcher.submit(("partition", step.index, key), functools.partial(self._read_partition, key))

    def _read_partition(self, key: PartitionKey) -> EntityTable:
        """A partition read into host memory (page-locked when training on a GPU)."""
        return pinned(self.ckpt.load(key[0], key[1], self.counts[key], device="cpu"), self.device)

    def load_unpartitioned(self) -> None:
        for key in self.layout.always_resident():
            if key not in self.resident and key in self.counts:
                self.resident[key] = self.ckpt.load(key[0], key[1], self.counts[key])

    def in_memory(self) -> list[tuple[PartitionKey, EntityTable]]:
        """Every table held, resident or parked: what the commit writes of them."""
        return [*self.resident.items(), *self.cache.items()]

    def unpartitioned(self, frozen: frozenset[str], want_frozen: bool) -> list[torch.Tensor]:
        """The unpartitioned tables and their Adagrad sums, of the frozen types or of the others."""
        tensors = []
        for key in self.layout.always_resident():
            if key in self.resident and (key[0] in frozen) == want_frozen:
                tensors += [self.resident[key].weights, self.resident[key].adagrad_sum]
        return tensors
