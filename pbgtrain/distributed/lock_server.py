"""The lock server of a distributed run, kept in the c10d store: one pass's buckets and locks.

Every trainer runs the same :class:`LockServerScheduler`; there is no server process. The
state of pass ``i`` (buckets done, partition locks, partitions initialized) is one JSON value
under ``sched/{i}``, read and written only while holding the store mutex ``sched/mutex``
(taken with an atomic ``compare_set``). The choice itself is :func:`pbgtrain.schedule.buckets.choose_bucket`.

Passes do not overlap: a trainer starts pass ``i+1`` only after the commit barrier of pass
``i``, by which time every trainer has handed back everything.

Why no trainer can deadlock: a trainer holds locks only while it trains, saves or chooses
(all finite); a trainer that finds no bucket (``WAIT``) first hands back everything it holds
and then asks again, so it waits holding nothing. A lost trainer (holding the mutex or locks)
is the watchdog's business: every rank stops within the peer timeout.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from pbgtrain.distributed.cluster import Cluster
from pbgtrain.schedule.buckets import (
    WAIT,
    Bucket,
    PartitionKey,
    PartitionSides,
    Wait,
    WrittenPartitions,
    choose_bucket,
    ordered_buckets,
)

MUTEX = "sched/mutex"


def partition_key_text(key: PartitionKey) -> str:
    """A partition's name in store keys and values (entity type names may hold any printable text)."""
    return f"{key[0]}\x00{key[1]}"


def _unkey(text: str) -> PartitionKey:
    entity_type, part = text.split("\x00")
    return entity_type, int(part)


class StoreWritten:
    """Which partitions are already in ``version`` (being built), for every rank (in the store)."""

    def __init__(self, cluster: Cluster, version: int) -> None:
        self.cluster = cluster
        self.version = version

    def _key(self, key: PartitionKey) -> str:
        return f"written/{self.version}/{partition_key_text(key)}"

    def add(self, key: PartitionKey) -> None:
        self.cluster.store.set(self._key(key), "1")

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and bool(self.cluster.store.check([self._key(key)]))


class LockServerScheduler:
    """Hands out the buckets of each pass to ``cluster.world_size`` trainers (see the module)."""

    def __init__(self, cluster: Cluster, nparts_lhs: int, nparts_rhs: int, order: str, layout: PartitionSides,
                 rows: Mapping[str, int], *, seed: int = 0, tree_init: bool = True,
                 on_new_pass: Callable[[], None] = lambda: None) -> None:
        self.cluster = cluster
        self.on_new_pass = on_new_pass  # the run's shared-state rounds start with each pass
        self.nparts_lhs, self.nparts_rhs = nparts_lhs, nparts_rhs
        self.order = order
        self.layout = layout
        self.rows = dict(rows)
        self.seed = seed
        self.tree_init = tree_init
        self.num_buckets = nparts_lhs * nparts_rhs
        self._pass: int | None = None
        self._order: list[Bucket] = []
        self._position = -1
        self.waits = 0  # times acquire answered WAIT (for the benchmark)

    # ---- the mutex
    def _locked(self, update: Any) -> Any:
        """Run ``update(state) -> (state, result)`` on this pass's state under the store mutex."""
        store, me = self.cluster.store, str(self.cluster.rank)
        self.cluster.wait_until(lambda: store.compare_set(MUTEX, "", me) == me.encode(), "the scheduler mutex")
        try:
            key = f"sched/{self._pass}"
            state = json.loads(bytes(store.get(key)).decode())
            state, result = update(state)
            store.set(key, json.dumps(state))
            return result
        finally:
            store.set(MUTEX, "")

    # ---- the protocol
    def new_pass(self, pass_idx: int) -> None:
        self.on_new_pass()
        self._pass = pass_idx
        rng = np.random.default_rng([self.seed, pass_idx])
        self._order = ordered_buckets(self.order, self.nparts_lhs, self.nparts_rhs, rng)
        first_pass_of_tree = self.tree_init and pass_idx == 0
        initial: dict[str, Any] = {"done": [], "locks": {}, "initialized": [] if first_pass_of_tree else None}
        self.cluster.store.compare_set(f"sched/{pass_idx}", "", json.dumps(initial))  # the first rank sets it

    def acquire(self) -> Bucket | Wait | None:
        def update(state: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            done = [Bucket(*b) for b in state["done"]]
            if len(done) >= self.num_buckets:
                return state, None
            locks = {_unkey(k): owner for k, owner in state["locks"].items()}
            initialized = None if state["initialized"] is None else [_unkey(k) for k in state["initialized"]]
            me = self.cluster.rank
            bucket = choose_bucket(self._order, done, locks, me, self.layout, self.rows, initialized)
            if bucket is None and initialized and all(owner == me for owner in locks.values()):
                bucket = choose_bucket(self._order, done, locks, me, self.layout, self.rows)  # never stall
            if bucket is None:
                return state, WAIT
            needed = self.layout.partitions(bucket)
            state["locks"].update({partition_key_text(k): me for k in needed})
            if state["initialized"] is not None:
                state["initialized"] = sorted(set(state["initialized"]) | {partition_key_text(k) for k in needed})
            state["done"].append([bucket.lhs, bucket.rhs])
            return state, (bucket, len(done))

        got = self._locked(update)
        if isinstance(got, Wait):
            self.waits += 1
            self.cluster.check()  # while waiting for another trainer's partitions: fail if the run failed elsewhere
            return got
        if got is None:
            return None
        bucket, self._position = got
        assert isinstance(bucket, Bucket)
        return bucket

    @property
    def position(self) -> int:
        return self._position

    def upcoming(self) -> Bucket | None:
        """Not known in advance: which bucket a trainer gets depends on what the others hold then."""
        return None

    def release(self, bucket: Bucket) -> None:
        """Nothing to tell: the bucket is done since it was acquired; its locks stay until handed back."""

    def written(self, version: int) -> WrittenPartitions:
        """Which partitions any trainer has saved into ``version`` (being built): in the store."""
        return StoreWritten(self.cluster, version)

    def hand_back(self, keys: Iterable[PartitionKey]) -> None:
        """Unlock ``keys`` (they are saved where their next holder reads them)."""
        wanted = {partition_key_text(k) for k in keys if k[0] not in self.layout.unpartitioned}
        if not wanted:
            return
        me = self.cluster.rank

        def update(state: dict[str, Any]) -> tuple[dict[str, Any], None]:
            state["locks"] = {k: owner for k, owner in state["locks"].items() if not (k in wanted and owner == me)}
            return state, None

        self._locked(update)

