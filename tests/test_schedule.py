"""Bucket orders, the single-machine scheduler and the partition-swap plan (pbgtrain.schedule.buckets)."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pbgio.config import parse_config
from pbgtrain.schedule.buckets import (
    BUCKET_ORDERS,
    Bucket,
    PartitionSides,
    SingleMachineScheduler,
    affinity_order,
    all_buckets,
    layered_order,
    ordered_buckets,
    plan_swap,
    run_pass,
    swap_sequence,
)

grids = st.tuples(st.integers(1, 7), st.integers(1, 7))
seeds = st.integers(0, 2**32 - 1)


@given(grid=grids, seed=seeds, order=st.sampled_from(BUCKET_ORDERS))
def test_every_order_yields_every_bucket_once(grid: tuple[int, int], seed: int, order: str) -> None:
    nl, nr = grid
    buckets = ordered_buckets(order, nl, nr, np.random.default_rng(seed))
    assert Counter(buckets) == Counter(all_buckets(nl, nr))
    assert all(0 <= b.lhs < nl and 0 <= b.rhs < nr for b in buckets)


@pytest.mark.parametrize("order", BUCKET_ORDERS)
def test_one_by_one_grid(order: str) -> None:
    assert ordered_buckets(order, 1, 1, np.random.default_rng(0)) == [Bucket(0, 0)]


def _shares(a: Bucket, b: Bucket) -> bool:
    return bool({a.lhs, a.rhs} & {b.lhs, b.rhs})


@given(grid=grids, seed=seeds)
def test_affinity_is_greedy_transposed_then_shared(grid: tuple[int, int], seed: int) -> None:
    nl, nr = grid
    order = affinity_order(nl, nr, np.random.default_rng(seed))
    remaining = set(order)
    remaining.discard(order[0])
    for prev, cur in itertools.pairwise(order):
        if prev.transposed() in remaining:
            assert cur == prev.transposed()
        elif any(_shares(prev, b) for b in remaining):
            assert _shares(prev, cur), (prev, cur, remaining)
        remaining.discard(cur)


def test_affinity_varies_with_the_seed() -> None:
    orders = {tuple(affinity_order(4, 4, np.random.default_rng(s))) for s in range(20)}
    assert len(orders) > 10


@given(grid=grids, seed=seeds, inside_out=st.booleans())
def test_layered_orders(grid: tuple[int, int], seed: int, inside_out: bool) -> None:
    nl, nr = grid
    order = layered_order(nl, nr, np.random.default_rng(seed), inside_out=inside_out)
    layers = [min(b.lhs, b.rhs) for b in order]
    # L-shaped layers by min(l, r): ascending inside-out, descending outside-in
    assert layers == sorted(layers, reverse=not inside_out)
    # transposed buckets adjacent
    for i, b in enumerate(order):
        t = b.transposed()
        if t != b and t.lhs < nl and t.rhs < nr:
            assert t in order[max(0, i - 1):i + 2]
    if inside_out:
        # every bucket after the first shares a partition index with one trained before it
        seen: set[int] = {order[0].lhs, order[0].rhs}
        for b in order[1:]:
            assert seen & {b.lhs, b.rhs}
            seen |= {b.lhs, b.rhs}


def test_layer_order_is_random_within_layers() -> None:
    firsts = Counter(layered_order(5, 5, np.random.default_rng(s))[0] for s in range(200))
    assert all(min(b.lhs, b.rhs) == 0 for b in firsts)
    assert len(firsts) >= 5  # (0,0) or any of the pairs (i,0)/(0,i) can open layer 0


def test_random_order_is_a_uniform_permutation() -> None:
    firsts = Counter(ordered_buckets("random", 2, 3, np.random.default_rng(s))[0] for s in range(3000))
    assert set(firsts) == set(all_buckets(2, 3))
    assert all(abs(c - 500) < 5 * (3000 * (1 / 6) * (5 / 6)) ** 0.5 for c in firsts.values())


def test_unknown_order_and_empty_grid_are_refused() -> None:
    with pytest.raises(ValueError, match="bucket order"):
        ordered_buckets("spiral", 2, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="at least one partition"):
        all_buckets(0, 2)


# --------------------------------------------------------------------------- scheduler


@given(grid=grids, seed=seeds, order=st.sampled_from(BUCKET_ORDERS), pass_idx=st.integers(0, 1000))
def test_scheduler_pass_hands_out_every_bucket_once(grid: tuple[int, int], seed: int, order: str,
                                                    pass_idx: int) -> None:
    sched = SingleMachineScheduler(*grid, order, seed=seed)
    got = list(run_pass(sched, pass_idx))
    assert Counter(got) == Counter(all_buckets(*grid))
    assert sched.pass_done and sched.acquire() is None
    # the same (seed, pass) reproduces the order (resume); the scheduler's state does not matter
    again = SingleMachineScheduler(*grid, order, seed=seed)
    assert list(run_pass(again, pass_idx)) == got


def test_scheduler_orders_differ_between_passes() -> None:
    sched = SingleMachineScheduler(4, 4, "random", seed=3)
    assert len({tuple(run_pass(sched, i)) for i in range(10)}) == 10


def test_scheduler_one_bucket_at_a_time() -> None:
    sched = SingleMachineScheduler(2, 2, "affinity", seed=0)
    sched.new_pass(0)
    upcoming = sched.upcoming()
    bucket = sched.acquire()
    assert bucket is not None and bucket == upcoming == sched.pass_order[0]
    with pytest.raises(RuntimeError, match="still held"):
        sched.acquire()
    with pytest.raises(RuntimeError, match="still held"):
        sched.new_pass(1)
    with pytest.raises(RuntimeError, match="released bucket"):
        sched.release(Bucket(9, 9))
    sched.release(bucket)
    assert not sched.pass_done


def test_scheduler_from_config() -> None:
    cfg = parse_config({
        "entities": {"u": {"num_partitions": 3}, "i": {"num_partitions": 2}, "t": {"num_partitions": 1}},
        "relations": [{"name": "a", "lhs": "u", "rhs": "i"}, {"name": "b", "lhs": "u", "rhs": "t"}],
        "dimension": 4, "entity_path": "e", "edge_paths": ["p"], "checkpoint_path": "c",
        "bucket_order": "outside_in"})
    sched = SingleMachineScheduler.from_config(cfg, seed=1)
    assert (sched.nparts_lhs, sched.nparts_rhs, sched.order) == (3, 2, "outside_in")
    assert len(list(run_pass(sched, 0))) == 6
    layout = PartitionSides.from_config(cfg)
    assert layout == PartitionSides(frozenset({"u"}), frozenset({"i"}), frozenset({"t"}))


# --------------------------------------------------------------------------- partition swaps

LAYOUT = PartitionSides(lhs_types=frozenset({"user", "page"}), rhs_types=frozenset({"user", "item"}),
                         unpartitioned=frozenset({"tag"}))


@given(grid=st.tuples(st.integers(1, 5), st.integers(1, 5)), seed=seeds, order=st.sampled_from(BUCKET_ORDERS))
def test_swaps_reload_only_changed_partitions(grid: tuple[int, int], seed: int, order: str) -> None:
    buckets = ordered_buckets(order, *grid, np.random.default_rng(seed))
    resident: set[tuple[str, int]] = {("tag", 0)}
    prev: Bucket | None = None
    for bucket, swap in zip(buckets, swap_sequence(buckets, LAYOUT, resident), strict=True):
        needed = LAYOUT.partitions(bucket)
        before = LAYOUT.partitions(prev) if prev is not None else frozenset()
        assert set(swap.load) == needed - before
        assert set(swap.evict) == before - needed
        assert set(swap.keep) == needed & before
        assert ("tag", 0) not in swap.evict + swap.load
        resident = (resident - set(swap.evict)) | set(swap.load)
        assert resident == needed | {("tag", 0)}
        prev = bucket


def test_swap_examples() -> None:
    # (0, 1) -> (1, 1): user is on both sides, so user 1 stays; page 0 -> page 1; item 1 stays
    resident = {("user", 0), ("user", 1), ("page", 0), ("item", 1), ("tag", 0)}
    swap = plan_swap(resident, Bucket(1, 1), LAYOUT)
    assert swap.evict == (("page", 0), ("user", 0))
    assert swap.load == (("page", 1),)
    assert swap.keep == (("item", 1), ("user", 1))
    assert swap.changes
    assert not plan_swap(LAYOUT.partitions(Bucket(1, 1)), Bucket(1, 1), LAYOUT).changes
    # the end of a pass evicts every partitioned one, never the unpartitioned ones
    final = plan_swap(resident, None, LAYOUT)
    assert set(final.evict) == resident - {("tag", 0)} and final.load == ()
    assert LAYOUT.always_resident() == (("tag", 0),)
