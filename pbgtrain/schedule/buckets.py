"""Which bucket to train next, and which partitions to swap for it.

A *bucket* ``(l, r)`` holds the edges whose lhs lies in partition ``l`` and rhs in
partition ``r``. Within one pass (one edge chunk of one edge path in one epoch) every
bucket is trained exactly once, in the ``bucket_order`` of the config, as the original's
``bucket_scheduling.py`` orders them:

- ``random``: a uniformly random permutation;
- ``affinity``: greedy from a random bucket: the transposed bucket next if it is left,
  else a bucket sharing a partition index with the current one, else any bucket;
- ``inside_out``: L-shaped layers ``min(l, r) = 0, 1, …``; inside a layer the pairs
  ``{(i, k), (k, i)}`` come in random order, each pair adjacent;
- ``outside_in``: the same layers, last layer first.

The training loop asks a :class:`BucketScheduler` for buckets (``new_pass``,
``acquire`` until None, ``release`` after each, ``hand_back`` of the partitions it saved).
:class:`SingleMachineScheduler` serves one trainer;
:class:`pbgtrain.distributed.lock_server.LockServerScheduler` serves many, with the original's
lock-server invariant, decided by :func:`choose_bucket`: a trainer gets a bucket only if no
other trainer holds one of its partitions, preferring the bucket that moves the fewest rows.

>>> sched = SingleMachineScheduler(2, 2, "inside_out", seed=0)
>>> sched.new_pass(0)
>>> order = []
>>> while (bucket := sched.acquire()) is not None:
...     order.append(str(bucket))
...     sched.release(bucket)
>>> sorted(order), order[-1]  # layer 1 is the bucket (1, 1) alone
(['(0, 0)', '(0, 1)', '(1, 0)', '(1, 1)'], '(1, 1)')

Only the partitions that change between buckets are swapped; unpartitioned types stay:

>>> layout = PartitionSides(lhs_types=frozenset({"user"}), rhs_types=frozenset({"user", "item"}),
...                          unpartitioned=frozenset({"tag"}))
>>> swap = plan_swap([("user", 0), ("item", 1), ("user", 1), ("tag", 0)], Bucket(0, 0), layout)
>>> swap.evict, swap.load, swap.keep
((('item', 1), ('user', 1)), (('item', 0),), (('user', 0),))
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, get_args

import numpy as np

from pbgio.checks.edges import SideLimits, relation_limits
from pbgio.config import BucketOrder

if TYPE_CHECKING:
    from pbgio.config import ConfigSchema

BUCKET_ORDERS: tuple[str, ...] = get_args(BucketOrder)

PartitionKey = tuple[str, int]


@dataclass(frozen=True, order=True)
class Bucket:
    """Bucket ``(lhs, rhs)``: partition indices, 0-based."""

    lhs: int
    rhs: int

    def transposed(self) -> Bucket:
        return Bucket(self.rhs, self.lhs)

    def __str__(self) -> str:
        return f"({self.lhs}, {self.rhs})"


# --------------------------------------------------------------------------- bucket orders


def all_buckets(nparts_lhs: int, nparts_rhs: int) -> list[Bucket]:
    """Every bucket of the grid, in lexicographic order."""
    _check_grid(nparts_lhs, nparts_rhs)
    return [Bucket(lhs, rhs) for lhs in range(nparts_lhs) for rhs in range(nparts_rhs)]


def _check_grid(nparts_lhs: int, nparts_rhs: int) -> None:
    if nparts_lhs < 1 or nparts_rhs < 1:
        raise ValueError(f"expected at least one partition per side, found {nparts_lhs}×{nparts_rhs}")


def random_order(nparts_lhs: int, nparts_rhs: int, rng: np.random.Generator) -> list[Bucket]:
    """A uniformly random permutation of all buckets."""
    buckets = all_buckets(nparts_lhs, nparts_rhs)
    return [buckets[i] for i in rng.permutation(len(buckets))]


def affinity_order(nparts_lhs: int, nparts_rhs: int, rng: np.random.Generator) -> list[Bucket]:
    """Greedy order: after each bucket, its transposed one if left, else one sharing a partition.

    A bucket shares a partition with another when one of its two partition indices equals
    one of the other's (on either side, as in the original: the same entity type is usually
    on both sides). Ties are broken at random; when nothing shares, any remaining bucket.
    """
    buckets = all_buckets(nparts_lhs, nparts_rhs)
    # Per partition index, the buckets touching it, shuffled; consumed lazily from the end.
    touching: list[list[Bucket]] = [[] for _ in range(max(nparts_lhs, nparts_rhs))]
    for bucket in buckets:
        touching[bucket.lhs].append(bucket)
        if bucket.rhs != bucket.lhs:
            touching[bucket.rhs].append(bucket)
    for i, group in enumerate(touching):
        touching[i] = [group[j] for j in rng.permutation(len(group))]
    fallback = [buckets[j] for j in rng.permutation(len(buckets))]
    remaining = set(buckets)
    current = buckets[int(rng.integers(len(buckets)))]
    ordered = [current]
    remaining.discard(current)
    while remaining:
        nxt: Bucket | None = current.transposed() if current.transposed() in remaining else None
        if nxt is None:
            parts = [current.lhs, current.rhs]
            if parts[0] != parts[1] and rng.integers(2):
                parts.reverse()
            for part in parts:
                nxt = _pop_remaining(touching[part], remaining)
                if nxt is not None:
                    break
        if nxt is None:
            nxt = _pop_remaining(fallback, remaining)
        assert nxt is not None
        ordered.append(nxt)
        remaining.discard(nxt)
        current = nxt
    return ordered


def _pop_remaining(stack: list[Bucket], remaining: set[Bucket]) -> Bucket | None:
    while stack:
        bucket = stack.pop()
        if bucket in remaining:
            return bucket
    return None


def layer_of_buckets(nparts_lhs: int, nparts_rhs: int, layer: int, rng: np.random.Generator) -> list[Bucket]:
    """Layer ``k``: the buckets with ``min(l, r) == k``, transposed pairs adjacent, pairs shuffled."""
    pairs: list[list[Bucket]] = []
    for i in range(layer, max(nparts_lhs, nparts_rhs)):
        pair = [b for b in (Bucket(i, layer), Bucket(layer, i)) if b.lhs < nparts_lhs and b.rhs < nparts_rhs]
        if len(pair) == 2 and pair[0] == pair[1]:
            pair = pair[:1]
        if pair:
            pairs.append(pair)
    return [bucket for j in rng.permutation(len(pairs)) for bucket in pairs[j]]


def layered_order(nparts_lhs: int, nparts_rhs: int, rng: np.random.Generator, *,
                  inside_out: bool = True) -> list[Bucket]:
    """``inside_out`` (layer 0 first) or ``outside_in`` (the last layer first)."""
    _check_grid(nparts_lhs, nparts_rhs)
    layers = [layer_of_buckets(nparts_lhs, nparts_rhs, k, rng) for k in range(min(nparts_lhs, nparts_rhs))]
    if not inside_out:
        layers.reverse()
    return [bucket for layer in layers for bucket in layer]


def ordered_buckets(order: str, nparts_lhs: int, nparts_rhs: int, rng: np.random.Generator) -> list[Bucket]:
    """All buckets of the grid in ``order`` (one of :data:`BUCKET_ORDERS`)."""
    if order == "random":
        return random_order(nparts_lhs, nparts_rhs, rng)
    if order == "affinity":
        return affinity_order(nparts_lhs, nparts_rhs, rng)
    if order in ("inside_out", "outside_in"):
        return layered_order(nparts_lhs, nparts_rhs, rng, inside_out=order == "inside_out")
    raise ValueError(f"expected a bucket order in {BUCKET_ORDERS}, found {order!r}")


# --------------------------------------------------------------------------- schedulers


class Wait:
    """What ``acquire`` returns when buckets are left but each needs a partition another
    trainer holds: save and hand back what you hold, then ask again."""

    def __repr__(self) -> str:
        return "WAIT"


WAIT = Wait()


class WrittenPartitions(Protocol):
    """The partitions written into one version being built: a set, or the store of a distributed run
    (where any trainer may have written them)."""

    def add(self, key: PartitionKey) -> None: ...

    def __contains__(self, key: object) -> bool: ...


class BucketScheduler(Protocol):
    """Hands out the buckets of one pass; the seam between one trainer and many.

    ``new_pass(i)`` starts pass ``i`` (the iteration index, so that a resumed run sees the
    same order); ``acquire()`` returns the next bucket to train (its place in the pass is
    then ``position``), :data:`WAIT`, or None when the pass has none left for this trainer;
    ``release(bucket)`` reports it trained. The partitions of a released bucket stay locked
    by this trainer (so that its next bucket may reuse them) until ``hand_back`` says they
    are saved where the next holder will read them; ``written(v)`` tells which partitions are
    already saved into version ``v`` (being built), by this trainer or another.
    ``upcoming()`` is the bucket the next ``acquire`` will return when that is known in advance
    (to read it ahead), else None.
    """

    def new_pass(self, pass_idx: int) -> None: ...

    def acquire(self) -> Bucket | Wait | None: ...

    @property
    def position(self) -> int: ...

    def release(self, bucket: Bucket) -> None: ...

    def hand_back(self, keys: Iterable[PartitionKey]) -> None: ...

    def upcoming(self) -> Bucket | None: ...

    def written(self, version: int) -> WrittenPartitions: ...


class SingleMachineScheduler:
    """One trainer, one bucket at a time, in a seeded ``bucket_order``.

    The order of pass ``i`` depends only on ``(seed, i)``.
    """

    def __init__(self, nparts_lhs: int, nparts_rhs: int, order: str, seed: int = 0) -> None:
        _check_grid(nparts_lhs, nparts_rhs)
        if order not in BUCKET_ORDERS:
            raise ValueError(f"expected a bucket order in {BUCKET_ORDERS}, found {order!r}")
        self.nparts_lhs = nparts_lhs
        self.nparts_rhs = nparts_rhs
        self.order = order
        self.seed = seed
        self._plan: list[Bucket] = []
        self._next = 0
        self._held: Bucket | None = None
        self._released = 0

    @classmethod
    def from_config(cls, config: ConfigSchema, seed: int = 0) -> SingleMachineScheduler:
        nparts_lhs, nparts_rhs = config.bucket_grid()
        return cls(nparts_lhs, nparts_rhs, config.bucket_order, seed)

    @property
    def num_buckets(self) -> int:
        return self.nparts_lhs * self.nparts_rhs

    def new_pass(self, pass_idx: int) -> None:
        if self._held is not None:
            raise RuntimeError(f"bucket {self._held} is still held; release it before a new pass")
        rng = np.random.default_rng([self.seed, pass_idx])
        self._plan = ordered_buckets(self.order, self.nparts_lhs, self.nparts_rhs, rng)
        self._next = 0
        self._released = 0

    def acquire(self) -> Bucket | Wait | None:
        if self._held is not None:
            raise RuntimeError(f"bucket {self._held} is still held; one machine trains one bucket at a time")
        if self._next >= len(self._plan):
            return None
        self._held = self._plan[self._next]
        self._next += 1
        return self._held

    def release(self, bucket: Bucket) -> None:
        if bucket != self._held:
            raise RuntimeError(f"released bucket {bucket}, but the bucket held is {self._held}")
        self._held = None
        self._released += 1

    @property
    def position(self) -> int:
        """The place of the last acquired bucket in the pass (0-based)."""
        return self._next - 1

    def hand_back(self, keys: Iterable[PartitionKey]) -> None:
        """Nothing to do: no other trainer waits for these partitions."""

    def written(self, version: int) -> WrittenPartitions:
        """The partitions this process writes into ``version``: a set."""
        return set()

    def upcoming(self) -> Bucket | None:
        """The bucket the next ``acquire`` returns (for prefetching its edges), or None."""
        return self._plan[self._next] if self._next < len(self._plan) else None

    @property
    def pass_order(self) -> tuple[Bucket, ...]:
        """The whole order of the current pass."""
        return tuple(self._plan)

    @property
    def pass_done(self) -> bool:
        return bool(self._plan) and self._released == len(self._plan)


def run_pass(scheduler: BucketScheduler, pass_idx: int) -> Iterator[Bucket]:
    """Start pass ``pass_idx`` and yield its buckets, releasing each when the loop moves on.

    A bucket whose loop body raises is not released.
    """
    scheduler.new_pass(pass_idx)
    while (bucket := scheduler.acquire()) is not None:
        if isinstance(bucket, Wait):
            raise RuntimeError("run_pass serves a scheduler that never waits (one trainer)")
        yield bucket
        scheduler.release(bucket)


# --------------------------------------------------------------------------- many trainers


def choose_bucket(order: Sequence[Bucket], done: Iterable[Bucket], locks: Mapping[PartitionKey, int], rank: int,
                  layout: PartitionSides, rows: Mapping[str, int],
                  initialized: Iterable[PartitionKey] | None = None) -> Bucket | None:
    """The bucket trainer ``rank`` should train next, or None when none may be taken now.

    A bucket may be taken when it is not ``done`` and none of its partitions is locked by
    another rank (``locks``: partition → rank); with ``initialized`` (the first pass of a
    ``distributed_tree_init_order`` run) one of its sides must also be initialized already,
    unless nothing is, as in the original's lock server. Among those, the one whose switch
    from the partitions ``rank`` holds moves the fewest rows (``rows``: average rows of a
    partition per entity type) wins, ties going to the earliest in the pass ``order``.

    >>> layout = PartitionSides(frozenset({"n"}), frozenset({"n"}))
    >>> order = all_buckets(2, 2)
    >>> choose_bucket(order, [Bucket(0, 0)], {("n", 0): 0}, 1, layout, {"n": 10}) is None  # all need n/0…
    False
    >>> choose_bucket(order, [Bucket(0, 0)], {("n", 0): 0}, 1, layout, {"n": 10})  # …but (1, 1)
    Bucket(lhs=1, rhs=1)
    >>> choose_bucket(order, [Bucket(0, 0)], {("n", 0): 0}, 0, layout, {"n": 10})  # rank 0 keeps n/0
    Bucket(lhs=0, rhs=1)
    """
    done = set(done)
    init = None if initialized is None else set(initialized)
    held = {key for key, owner in locks.items() if owner == rank}
    best: tuple[int, int] | None = None
    chosen = None
    for position, bucket in enumerate(order):
        if bucket in done:
            continue
        needed = layout.partitions(bucket)
        if any(locks.get(key, rank) != rank for key in needed):
            continue
        if init and not (all((t, bucket.lhs) in init for t in layout.lhs_types)
                         or all((t, bucket.rhs) in init for t in layout.rhs_types)):
            continue
        cost = sum(rows.get(t, 0) for t, _ in needed ^ held)
        if best is None or (cost, position) < best:
            best, chosen = (cost, position), bucket
    return chosen


# --------------------------------------------------------------------------- partition swapping


@dataclass(frozen=True)
class PartitionSides:
    """Which entity types follow the bucket's lhs / rhs partition, and which are always resident.

    A partitioned type on the lhs of some relation needs partition ``l`` of bucket ``(l, r)``;
    on the rhs, partition ``r``; on both sides, both. Unpartitioned types use partition 0
    and are never swapped.
    """

    lhs_types: frozenset[str]
    rhs_types: frozenset[str]
    unpartitioned: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, config: ConfigSchema) -> PartitionSides:
        def partitioned(side: str) -> frozenset[str]:
            return frozenset(getattr(r, side) for r in config.relations
                             if config.num_partitions(getattr(r, side)) > 1)

        return cls(partitioned("lhs"), partitioned("rhs"),
                   frozenset(name for name, e in config.entities.items() if e.num_partitions == 1))

    def partitions(self, bucket: Bucket) -> frozenset[PartitionKey]:
        """The partitioned (type, partition) pairs bucket ``bucket`` needs resident."""
        return frozenset({(t, bucket.lhs) for t in self.lhs_types} | {(t, bucket.rhs) for t in self.rhs_types})

    def always_resident(self) -> tuple[PartitionKey, ...]:
        return tuple(sorted((t, 0) for t in self.unpartitioned))

    def partition_of(self, entity_type: str, bucket: Bucket, side: str) -> int:
        """The partition of ``entity_type`` that bucket ``bucket`` uses on ``side`` (0 when unpartitioned)."""
        if entity_type in self.unpartitioned:
            return 0
        return bucket.lhs if side == "lhs" else bucket.rhs


@dataclass(frozen=True)
class PartitionSwap:
    """What to do before training a bucket: save and drop ``evict``, read ``load``; ``keep`` stays."""

    evict: tuple[PartitionKey, ...]
    load: tuple[PartitionKey, ...]
    keep: tuple[PartitionKey, ...]

    @property
    def changes(self) -> bool:
        return bool(self.evict or self.load)


def plan_swap(resident: Iterable[PartitionKey], bucket: Bucket | None, layout: PartitionSides) -> PartitionSwap:
    """The partitions to evict and load so that exactly ``bucket``'s partitions are resident.

    ``resident`` may include unpartitioned types; they are neither evicted nor listed.
    ``bucket=None`` evicts every partitioned one (the end of a pass). Lists are sorted.
    """
    held = {key for key in resident if key[0] not in layout.unpartitioned}
    needed = layout.partitions(bucket) if bucket is not None else frozenset()
    return PartitionSwap(evict=tuple(sorted(held - needed)), load=tuple(sorted(needed - held)),
                         keep=tuple(sorted(held & needed)))


def swap_sequence(order: Sequence[Bucket], layout: PartitionSides,
                  resident: Iterable[PartitionKey] = ()) -> list[PartitionSwap]:
    """The swaps of a whole pass, starting from ``resident``."""
    held = set(resident)
    swaps = []
    for bucket in order:
        swap = plan_swap(held, bucket, layout)
        held = (held - set(swap.evict)) | set(swap.load)
        swaps.append(swap)
    return swaps


def bucket_limits(cfg: Any, counts: dict[PartitionKey, int], bucket: Bucket,
                  num_dynamic_rels: int | None) -> dict[str, SideLimits]:
    """The limits of a bucket's ids (``check_bounds``'s ``lhs`` and ``rhs``), from the entity counts."""
    num_relations = len(cfg.relations) if num_dynamic_rels is None else num_dynamic_rels
    lhs = relation_limits(cfg, "lhs", bucket.lhs, num_relations, counts)
    rhs = relation_limits(cfg, "rhs", bucket.rhs, num_relations, counts)
    if lhs is None or rhs is None:  # a validated config names only its own types
        raise RuntimeError(f"no id limits for bucket {bucket}: a relation names a type the config lacks")
    return {"lhs": lhs, "rhs": rhs}
