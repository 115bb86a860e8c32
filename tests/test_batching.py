"""Batch preparation (pbgtrain.schedule.batching)."""

from __future__ import annotations

import math
import sys
from collections import Counter
from fractions import Fraction
from functools import cache

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pbgio.checkpoint import IterationInfo
from pbgio.config import parse_config
from pbgtrain.schedule.batching import (
    Batches,
    ChunkKey,
    IterationSchedule,
    grouped_batches,
    hold_out,
    make_batches,
    mixed_batches,
    prepare_chunk,
    resolve_num_edge_chunks,
    shuffle,
    split_equally,
    stable_seed,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- iteration plan


@given(epochs=st.integers(0, 4), paths=st.integers(1, 3), chunks=st.integers(1, 4), data=st.data())
def test_plan_order_and_resume(epochs: int, paths: int, chunks: int, data: st.DataObject) -> None:
    edge_paths = tuple(f"data/p{i}" for i in range(paths))
    plan = IterationSchedule(epochs, edge_paths, chunks)
    expected = [(e, p, c) for e in range(epochs) for p in range(paths) for c in range(chunks)]
    steps = list(plan)
    assert [(s.epoch_idx, s.edge_path_idx, s.edge_chunk_idx) for s in steps] == expected
    assert [s.index for s in steps] == list(range(len(expected))) and len(plan) == len(expected)
    for s in steps:
        assert s.version == s.index + 1 and s.edge_path == edge_paths[s.edge_path_idx]
        assert s.info() == IterationInfo(epochs, s.epoch_idx, paths, s.edge_path_idx, s.edge_path, chunks,
                                         s.edge_chunk_idx)
        assert plan.starts_epoch(s.index) == (s.edge_path_idx == 0 and s.edge_chunk_idx == 0)
    committed = data.draw(st.integers(0, len(expected) + 3))
    assert list(plan.steps(committed)) == steps[committed:]


def test_plan_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="committed version"):
        list(IterationSchedule(1, ("p",), 1).steps(-1))
    with pytest.raises(ValueError, match="num_edge_chunks"):
        IterationSchedule(1, ("p",), 0)
    with pytest.raises(IndexError):
        IterationSchedule(1, ("p",), 2).step(2)


def test_num_edge_chunks() -> None:
    assert resolve_num_edge_chunks(3, [10**12]) == 3
    assert resolve_num_edge_chunks(None, [10, 25, 7], max_edges_per_chunk=10) == 3
    assert resolve_num_edge_chunks(None, [20], max_edges_per_chunk=10) == 2
    assert resolve_num_edge_chunks(None, [0]) == 1
    assert resolve_num_edge_chunks(None, [1_500_000_000]) == 2  # the default limit is 1e9 edges
    cfg = parse_config({"entities": {"e": {"num_partitions": 1}},
                        "relations": [{"name": "r", "lhs": "e", "rhs": "e"}], "dimension": 4,
                        "entity_path": "x", "edge_paths": ["a", "b"], "checkpoint_path": "c",
                        "num_epochs": 3, "max_edges_per_chunk": 100})
    plan = IterationSchedule.from_config(cfg, [250, 301])
    assert (plan.num_epochs, plan.edge_paths, plan.num_edge_chunks) == (3, ("a", "b"), 4)


# --------------------------------------------------------------------------- hold-out


def test_stable_seed_does_not_depend_on_the_process() -> None:
    # A fixed value: Python's hash() of a str changes with PYTHONHASHSEED, this must not.
    assert stable_seed("holdout", "data/train", 0, 1, 2) == 3905102483314198276
    assert ChunkKey(0, 0, 1, 2).holdout_seed() == stable_seed("holdout", 0, 0, 1, 2)


@given(n=st.integers(0, 3000), fraction=st.floats(0, 1), chunk=st.integers(0, 3), lhs=st.integers(0, 3))
def test_hold_out_is_stable_and_fraction_sized(n: int, fraction: float, chunk: int, lhs: int) -> None:
    key = ChunkKey(0, chunk, lhs, 0)
    held = hold_out(n, fraction, key)
    assert len(held.eval_idx) == int(n * fraction)
    assert torch.equal(held.eval_idx, hold_out(n, fraction, ChunkKey(0, chunk, lhs, 0)).eval_idx)
    assert held.train_idx.tolist() == sorted(set(range(n)) - set(held.eval_idx.tolist()))


def test_hold_out_samples_with_replacement_and_depends_on_the_key() -> None:
    held = hold_out(1000, 0.5, ChunkKey(0, 0, 0, 0))
    distinct = len(set(held.eval_idx.tolist()))
    assert distinct < 500  # 500 draws with replacement from 1000 repeat some (expected ~393 distinct)
    assert len(held.train_idx) == 1000 - distinct
    others = [hold_out(1000, 0.5, k).eval_idx for k in
              (ChunkKey(1, 0, 0, 0), ChunkKey(0, 1, 0, 0), ChunkKey(0, 0, 1, 0), ChunkKey(0, 0, 0, 1))]
    assert all(not torch.equal(held.eval_idx, o) for o in others)
    with pytest.raises(ValueError, match="eval_fraction"):
        hold_out(10, 1.5, ChunkKey(0, 0, 0, 0))


def test_same_hold_out_every_epoch_different_shuffle() -> None:
    rel = torch.randint(0, 4, (5000,), generator=gen(0))
    key = ChunkKey(0, 1, 0, 1)
    epochs = [prepare_chunk(rel, key=key, eval_fraction=0.1, batch_size=64, dynamic=False, num_workers=2,
                            shuffle_seed=key.shuffle_seed(7, epoch)) for epoch in range(3)]
    for prepared in epochs[1:]:
        assert torch.equal(prepared.held_out.eval_idx, epochs[0].held_out.eval_idx)
        assert not torch.equal(prepared.worker_batches[0].edge_idx, epochs[0].worker_batches[0].edge_idx)
    again = prepare_chunk(rel, key=key, eval_fraction=0.1, batch_size=64, dynamic=False, num_workers=2,
                          shuffle_seed=key.shuffle_seed(7, 0))
    for a, b in zip(again.worker_batches, epochs[0].worker_batches, strict=True):
        assert torch.equal(a.edge_idx, b.edge_idx) and torch.equal(a.offsets, b.offsets)


@given(n=st.integers(0, 500), fraction=st.sampled_from([0.0, 0.05, 0.3]), workers=st.integers(1, 4),
       batch_size=st.integers(1, 40), dynamic=st.booleans(), nrel=st.integers(1, 5), seed=st.integers(0, 99))
def test_prepare_chunk_partitions_the_edges(n: int, fraction: float, workers: int, batch_size: int,
                                            dynamic: bool, nrel: int, seed: int) -> None:
    rel = np.random.default_rng(seed).integers(0, nrel, n)
    prepared = prepare_chunk(rel, key=ChunkKey(0, 0, 0, 0), eval_fraction=fraction, batch_size=batch_size,
                             dynamic=dynamic, num_workers=workers, shuffle_seed=seed)
    trained = torch.cat([b.edge_idx for b in prepared.worker_batches])
    assert sorted(trained.tolist()) == prepared.held_out.train_idx.tolist()
    assert prepared.num_train_edges == len(trained)
    sizes = [b.num_edges for b in prepared.worker_batches]
    assert len(sizes) == workers and max(sizes) - min(sizes) <= 1
    for batches in prepared.worker_batches:
        assert all(1 <= len(b) <= batch_size for b in batches)


def test_shuffle_and_split() -> None:
    idx = torch.arange(1000)
    shuffled = shuffle(idx, gen(1))
    assert sorted(shuffled.tolist()) == idx.tolist() and not torch.equal(shuffled, idx)
    parts = split_equally(torch.arange(10), 3)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [len(p) for p in split_equally(torch.arange(2), 4)] == [1, 1, 0, 0]


# --------------------------------------------------------------------------- batches


@given(n=st.integers(0, 300), batch_size=st.integers(1, 50))
def test_dynamic_batches_are_contiguous(n: int, batch_size: int) -> None:
    idx = torch.randperm(n, generator=gen(n))
    batches = make_batches(idx, torch.zeros(n, dtype=torch.int64), batch_size, dynamic=True, generator=gen(0))
    assert batches.relations is None
    assert len(batches) == math.ceil(n / batch_size)
    for k, b in enumerate(batches):
        assert torch.equal(b, idx[k * batch_size:(k + 1) * batch_size])
        assert torch.equal(batches[k], b)
    assert torch.equal(torch.cat(list(batches)) if len(batches) else idx, idx)


@given(rels=st.lists(st.integers(0, 4), max_size=300), batch_size=st.integers(1, 20), seed=st.integers(0, 999))
def test_static_batches(rels: list[int], batch_size: int, seed: int) -> None:
    n = len(rels)
    rel = torch.tensor(rels, dtype=torch.int64)
    idx = torch.randperm(n, generator=gen(seed))  # the shuffled order of the edges
    batches = grouped_batches(idx, rel, batch_size, gen(seed))
    # every edge exactly once
    assert sorted(batches.edge_idx.tolist()) == list(range(n))
    assert batches.relations is not None and len(batches.relations) == len(batches)
    per_rel: dict[int, list[int]] = {}
    last_of: dict[int, int] = {}
    for k, b in enumerate(batches):
        r = batches.relation(k)
        assert r is not None and 1 <= len(b) <= batch_size
        assert set(rel[b].tolist()) == {r}  # single relation
        if len(b) < batch_size:
            last_of[r] = k  # a short batch takes what is left of its relation
        per_rel.setdefault(r, []).extend(b.tolist())
    for r, edges in per_rel.items():
        # a relation's batches take its edges in order: the first batch_size left each time
        assert edges == [i for i in idx.tolist() if rels[i] == r]
        if r in last_of:
            assert all(batches.relation(k) != r for k in range(last_of[r] + 1, len(batches)))
    assert len(batches) == sum(math.ceil(c / batch_size) for c in Counter(rels).values())


def test_static_batches_take_relation_ids_from_any_array() -> None:
    rel = np.array([5, 5, 9, 9, 9])
    batches = grouped_batches(torch.tensor([4, 0, 2]), rel, 10, gen(0))
    assert sorted((batches.relation(k), b.tolist()) for k, b in enumerate(batches)) == [(5, [0]), (9, [4, 2])]
    empty = grouped_batches(torch.zeros(0, dtype=torch.int64), rel, 3, gen(0))
    assert len(empty) == 0 and list(empty) == []


def _exact_sequence_probabilities(counts: tuple[int, ...], batch_size: int,
                                  by_batch: bool = False) -> dict[tuple[int, ...], Fraction]:
    """Brute force over the seed's process: draw a relation ∝ its edges left, remove a batch.

    ``by_batch`` instead models a plausible wrong process (a random permutation of batches,
    each drawn ∝ its own size), so the test below shows it can tell the two apart.
    """
    @cache
    def walk(left: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[int, ...], Fraction], ...]:
        if not any(left):
            return (((), Fraction(1)),)
        out: dict[tuple[int, ...], Fraction] = {}
        total = sum(sum(b) for b in left)
        for r, sizes in enumerate(left):
            choices = [(j, Fraction(s, total)) for j, s in enumerate(sizes)] if by_batch else (
                [(0, Fraction(sum(sizes), total))] if sizes else [])
            for j, p in choices:
                rest = list(left)
                rest[r] = sizes[:j] + sizes[j + 1:]
                for seq, q in walk(tuple(rest)):
                    out[(r, *seq)] = out.get((r, *seq), Fraction(0)) + p * q
        return tuple(out.items())

    start = tuple(tuple(min(batch_size, c - k) for k in range(0, c, batch_size)) for c in counts)
    return dict(walk(start))


def _chi_square(observed: Counter[tuple[int, ...]], probs: dict[tuple[int, ...], Fraction], trials: int) -> float:
    assert set(observed) <= set(probs)
    return sum((observed[seq] - trials * float(p)) ** 2 / (trials * float(p)) for seq, p in probs.items())


def test_relation_sampling_follows_the_proportional_rule() -> None:
    # Whole sequences of batch relations against their exact probabilities. (7, 7) edges in batches
    # of 3 makes short last batches matter, so a subtly wrong process is far from the right one.
    counts, batch_size, trials = (7, 7), 3, 3000
    rel = torch.tensor([r for r, c in enumerate(counts) for _ in range(c)])
    exact = _exact_sequence_probabilities(counts, batch_size)
    wrong = _exact_sequence_probabilities(counts, batch_size, by_batch=True)
    seen: Counter[tuple[int, ...]] = Counter()
    for s in range(trials):
        relations = grouped_batches(torch.randperm(len(rel), generator=gen(s)), rel, batch_size, gen(s)).relations
        assert relations is not None
        seen[tuple(relations.tolist())] += 1
    df = len(exact) - 1
    threshold = df + 5 * math.sqrt(2 * df)  # ~5 standard deviations of a chi-square with df degrees
    assert _chi_square(seen, exact, trials) < threshold
    # the same tolerance rejects the wrong process (expected statistic ≈ df + 0.047 · trials ≈ 160)
    assert _chi_square(seen, wrong, trials) > threshold


def test_first_relation_frequencies_are_proportional() -> None:
    counts, trials = (400, 120, 24, 1), 2000
    rel = torch.tensor([r for r, c in enumerate(counts) for _ in range(c)])
    idx = torch.arange(len(rel))
    firsts: Counter[int] = Counter()
    for s in range(trials):
        relations = grouped_batches(idx, rel, 40, gen(s)).relations
        assert relations is not None
        firsts[int(relations[0])] += 1
    for r, c in enumerate(counts):
        p = c / sum(counts)
        assert abs(firsts[r] / trials - p) <= 5 * math.sqrt(p * (1 - p) / trials) + 1 / trials


def test_batches_accessors() -> None:
    batches = Batches(torch.tensor([7, 8, 9]), torch.tensor([0, 2, 3]), torch.tensor([1, 0]))
    assert batches[-1].tolist() == [9] and batches.sizes().tolist() == [2, 1] and batches.relation(0) == 1
    with pytest.raises(IndexError):
        batches[2]
    assert [b.tolist() for b in mixed_batches(torch.arange(4), 2)] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="batch_size"):
        mixed_batches(torch.arange(4), 0)


def _python_calls(rel: torch.Tensor, batch_size: int) -> tuple[int, int]:
    """The Python and C function calls ``prepare_chunk`` makes on ``rel`` (sys.setprofile), and its train edges."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        prepared = prepare_chunk(rel, key=ChunkKey(0, 0, 0, 0), eval_fraction=0.05, batch_size=batch_size,
                                 dynamic=False, num_workers=2, shuffle_seed=1)
    finally:
        sys.setprofile(None)
    return calls, prepared.num_train_edges


def test_batching_a_million_edges_does_no_python_work_per_edge_or_per_batch() -> None:
    """Batching is vectorized: the same Python calls for 10k edges as for 1M, and for 10 batches as
    for 10,000 (a loop over edges or batches in Python would multiply them; its speed is
    ``tools/bench_train.py``'s to measure, not a test's)."""
    small = torch.randint(0, 500, (10_000,), generator=gen(0))
    large = torch.randint(0, 500, (1_000_000,), generator=gen(0))
    calls_small, _ = _python_calls(small, 1000)
    calls_large, train_edges = _python_calls(large, 1000)
    calls_many_batches, _ = _python_calls(large, 100)
    assert train_edges > 900_000
    assert calls_large == calls_small == calls_many_batches
