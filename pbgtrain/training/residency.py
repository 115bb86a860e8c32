"""Where partitions live between buckets, and what is read ahead, in a single-process run.

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

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from pbgtrain.model import EntityTable

PartitionKey = tuple[str, int]

GIB = 1 << 30
DEVICE_HEADROOM = 0.25
"""Share of a GPU's free memory left to the step's working set when the cache budget is automatic."""


def table_bytes(table: EntityTable) -> int:
    return table.weights.numel() * table.weights.element_size() + table.adagrad_sum.numel() * \
        table.adagrad_sum.element_size()


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
        size = table_bytes(table)
        if self.bytes + size > self.budget_bytes:
            return False
        self._parked[key] = table
        self.bytes += size
        return True

    def take(self, key: PartitionKey) -> EntityTable | None:
        """The parked table of ``key`` (no longer parked), or None."""
        table = self._parked.pop(key, None)
        if table is not None:
            self.bytes -= table_bytes(table)
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
            self._pending[key] = self._pool.submit(read)

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
