"""Ranking metrics and filtered evaluation (pbgtrain.metrics) against brute-force references."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pbgtrain.metrics import (
    SIDES,
    EvalProtocol,
    FilterIndex,
    RankingAccumulator,
    Side,
    randomized_auc,
    ranks,
)

# Scores from a small set so that ties are common.
score_values = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0])


@st.composite
def scored_batches(draw: st.DrawFn, max_b: int = 8, max_c: int = 12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b = draw(st.integers(0, max_b))
    c = draw(st.integers(0, max_c))
    pos = torch.tensor(draw(st.lists(score_values, min_size=b, max_size=b)), dtype=torch.float32)
    cand = torch.tensor(draw(st.lists(st.lists(score_values, min_size=c, max_size=c), min_size=b, max_size=b)),
                        dtype=torch.float32).reshape(b, c)
    exclude = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=c, max_size=c), min_size=b,
                                         max_size=b)), dtype=torch.bool).reshape(b, c)
    return pos, cand, exclude


def brute_rank(pos: float, row: list[float], excluded: list[bool]) -> int:
    return 1 + sum(1 for s, x in zip(row, excluded, strict=True) if not x and s >= pos)


@given(batch=scored_batches(), use_mask=st.booleans())
def test_ranks_match_brute_force(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], use_mask: bool) -> None:
    pos, cand, exclude = batch
    got = ranks(pos, cand, exclude if use_mask else None).tolist()
    for i in range(len(pos)):
        mask = exclude[i].tolist() if use_mask else [False] * cand.shape[1]
        assert got[i] == brute_rank(float(pos[i]), cand[i].tolist(), mask)


def test_ties_count_against_the_positive() -> None:
    pos = torch.tensor([1.0, 1.0, 1.0])
    cand = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 2.0], [0.9, 0.9, 0.9]])
    assert ranks(pos, cand).tolist() == [4, 3, 1]  # a constant scorer gets the worst rank, C + 1
    # a NaN positive is ranked last too, after the excluded candidates are left out
    nan = ranks(torch.tensor([math.nan]), torch.zeros(1, 5), torch.tensor([[True, False, False, False, False]]))
    assert nan.tolist() == [5]
    with pytest.raises(ValueError, match="candidate_scores"):
        ranks(torch.zeros(2), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="exclude"):
        ranks(torch.zeros(2), torch.zeros(2, 4), torch.zeros(2, 4))


side_ranks = st.lists(st.integers(1, 80), max_size=30)


@given(lhs=side_ranks, rhs=side_ranks, split=st.integers(0, 30))
def test_metrics_match_brute_force(lhs: list[int], rhs: list[int], split: int) -> None:
    protocol = EvalProtocol.all_entities(100, filtered=True)
    acc = RankingAccumulator(protocol)
    other = RankingAccumulator(protocol)
    sides: tuple[tuple[Side, list[int]], ...] = (("lhs", lhs), ("rhs", rhs))
    for side, values in sides:
        acc.add_ranks(side, torch.tensor(values[:split], dtype=torch.int64))
        other.add_ranks(side, torch.tensor(values[split:], dtype=torch.int64))
    acc.merge(other)
    result = acc.result()

    def side_ref(values: list[int]) -> dict[str, float]:
        n = len(values)
        return {"mrr": sum(1 / r for r in values) / n, "mr": sum(values) / n,
                **{f"h{k}": sum(r <= k for r in values) / n for k in (1, 3, 10, 50)}}

    refs = {side: side_ref(v) for side, v in sides if v}
    assert result.count == max(len(lhs), len(rhs))
    for side, ref in refs.items():
        m = result.per_side[side]
        assert m.mrr == pytest.approx(ref["mrr"]) and m.mr == pytest.approx(ref["mr"])
        assert [m.hits[k] for k in (1, 3, 10, 50)] == pytest.approx([ref[f"h{k}"] for k in (1, 3, 10, 50)])
    if refs:  # both sides averaged (each side over its own edges)
        assert result.mrr == pytest.approx(sum(r["mrr"] for r in refs.values()) / len(refs))
        assert result.mr == pytest.approx(sum(r["mr"] for r in refs.values()) / len(refs))
        assert result.hits[10] == pytest.approx(sum(r["h10"] for r in refs.values()) / len(refs))
    else:
        assert math.isnan(result.mrr) and result.to_dict()["metrics"] == {}
    json.dumps(result.to_dict(), allow_nan=False)


@given(batch=scored_batches(max_b=6, max_c=6))
def test_accumulated_scores_match_brute_force(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    pos, cand, exclude = batch
    acc = RankingAccumulator(EvalProtocol.sampled(50, 50), hits_at=(1, 2))
    acc.add("rhs", pos, cand, exclude)
    acc.add("lhs", pos, cand)
    result = acc.result()
    if len(pos) == 0:
        assert result.count == 0 and "no edges" in result.format()
        return
    rhs = [brute_rank(float(pos[i]), cand[i].tolist(), exclude[i].tolist()) for i in range(len(pos))]
    lhs = [brute_rank(float(pos[i]), cand[i].tolist(), [False] * cand.shape[1]) for i in range(len(pos))]
    assert result.per_side["rhs"].mr == pytest.approx(sum(rhs) / len(rhs))
    assert result.per_side["lhs"].hits[2] == pytest.approx(sum(r <= 2 for r in lhs) / len(lhs))
    expected = (sum(1 / r for r in rhs) / len(rhs) + sum(1 / r for r in lhs) / len(lhs)) / 2
    assert result.mrr == pytest.approx(expected)


def test_randomized_auc() -> None:
    gen = torch.Generator().manual_seed(0)
    pos = torch.rand(200, generator=gen)
    cand = torch.rand(200, 50, generator=gen)
    exact = float((pos[:, None, None] > cand[None]).float().mean())  # every (positive, candidate) pair
    wins, pairs = randomized_auc(pos, cand, num_samples=40_000, generator=gen)
    assert pairs == 40_000
    assert abs(wins / pairs - exact) < 5 * math.sqrt(0.25 / pairs)
    # separated scores, ties (strictly higher wins), excluded candidates never drawn
    assert randomized_auc(cand.max() + pos, cand) == (200, 200)
    assert randomized_auc(torch.zeros(4), torch.zeros(4, 3)) == (0, 4)
    spoiled = cand.clone()
    exclude = torch.zeros_like(cand, dtype=torch.bool)
    exclude[:, :45] = True
    spoiled[exclude] = 99.0
    wins, pairs = randomized_auc(pos + 1.0, spoiled, exclude, generator=gen)
    assert wins == pairs > 0
    assert randomized_auc(pos, cand, torch.ones_like(exclude)) == (0, 0)
    assert randomized_auc(torch.zeros(0), torch.zeros(0, 3)) == (0, 0)


def test_auc_in_accumulated_metrics() -> None:
    acc = RankingAccumulator(EvalProtocol.sampled(0, 10), seed=1)
    acc.add("lhs", torch.full((10,), 5.0), torch.zeros(10, 10))
    acc.add("rhs", torch.full((10,), -5.0), torch.zeros(10, 10))
    result = acc.result()
    assert (result.per_side["lhs"].auc, result.per_side["rhs"].auc, result.auc) == (1.0, 0.0, 0.5)


def test_protocol_descriptions_and_stats() -> None:
    assert EvalProtocol.all_entities(14541, filtered=True).describe() == (
        "filtered, all 14,541 entities as candidates, both sides averaged")
    assert EvalProtocol.sampled(1000, 1000).describe() == (
        "raw, 1,000 batch + 1,000 uniform negatives, both sides averaged")
    assert EvalProtocol.sampled(0, 50, sides=["rhs"]).describe() == "raw, 50 uniform negatives, rhs side only"
    acc = RankingAccumulator(EvalProtocol.sampled(1000, 1000, sides=["rhs"]))
    acc.add_ranks("rhs", torch.tensor([1, 2, 4]))
    acc.add_loss(6.0, 3)
    with pytest.raises(ValueError, match="not in the protocol"):
        acc.add_ranks("lhs", torch.tensor([1]))
    result = acc.result()
    stats = result.to_dict()
    assert stats["count"] == 3 and stats["protocol"] == "raw, 1,000 batch + 1,000 uniform negatives, rhs side only"
    assert stats["metrics"] == pytest.approx({"loss": 2.0, "pos_rank": 7 / 3, "mrr": (1 + 1 / 2 + 1 / 4) / 3,
                                              "r1": 1 / 3, "r3": 2 / 3, "r10": 1.0, "r50": 1.0})
    assert "auc" not in stats["metrics"]  # no pairs were drawn: left out rather than NaN
    line = result.format()
    assert line.startswith("loss 2  MRR 0.5833  MR 2.33  Hits@1 0.3333") and line.endswith(
        "(raw, 1,000 batch + 1,000 uniform negatives, rhs side only; 3 edges)")
    with pytest.raises(ValueError, match="different protocols"):
        acc.merge(RankingAccumulator(EvalProtocol.sampled(1, 1)))


# --------------------------------------------------------------------------- filtering

ids = st.integers(0, 5)
triples = st.lists(st.tuples(ids, st.integers(0, 2), ids), max_size=25)


def _arrays(edges: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = np.array(edges, dtype=np.int64).reshape(-1, 3)
    return a[:, 0], a[:, 1], a[:, 2]


def reference_mask(known: set[tuple[int, int, int]], side: str, batch: list[tuple[int, int, int]],
                   candidates: list[list[int]], include_positive: bool) -> list[list[bool]]:
    out = []
    for (h, r, t), row in zip(batch, candidates, strict=True):
        positive = t if side == "rhs" else h
        # known true candidates other than the positive; the positive's own slot iff include_positive
        out.append([include_positive if c == positive else ((h, r, c) if side == "rhs" else (c, r, t)) in known
                    for c in row])
    return out


@given(sets=st.lists(triples, min_size=1, max_size=3), batch=st.lists(st.tuples(ids, st.integers(0, 3), ids),
                                                                       max_size=8),
       side=st.sampled_from(SIDES), include_positive=st.booleans(), data=st.data())
def test_filter_masks_match_brute_force(sets: list[list[tuple[int, int, int]]], batch: list[tuple[int, int, int]],
                                        side: Side, include_positive: bool, data: st.DataObject) -> None:
    index = FilterIndex.from_edges(*(_arrays(s) for s in sets))
    known = {e for s in sets for e in s}
    lhs, rel, rhs = (torch.tensor([e[i] for e in batch], dtype=torch.int64) for i in range(3))
    n = 8  # entity ids run to 5; queries may use relation 3, unknown to the index
    dense = index.mask(side, lhs, rel, rhs, num_entities=n, include_positive=include_positive)
    assert dense.tolist() == reference_mask(known, side, batch, [list(range(n))] * len(batch), include_positive)
    shared = data.draw(st.lists(st.integers(0, 7), max_size=6))
    got = index.mask(side, lhs, rel, rhs, candidates=torch.tensor(shared, dtype=torch.int64),
                     include_positive=include_positive)
    assert got.shape == (len(batch), len(shared))
    assert got.tolist() == reference_mask(known, side, batch, [shared] * len(batch), include_positive)
    per_row = data.draw(st.lists(st.lists(st.integers(0, 7), min_size=3, max_size=3), min_size=len(batch),
                                 max_size=len(batch)))
    got = index.mask(side, lhs, rel, rhs, candidates=torch.tensor(per_row, dtype=torch.int64).reshape(-1, 3),
                     include_positive=include_positive)
    assert got.tolist() == reference_mask(known, side, batch, per_row, include_positive)


@given(edges=triples, batch_seed=st.integers(0, 1000))
def test_filtered_ranks_match_brute_force(edges: list[tuple[int, int, int]], batch_seed: int) -> None:
    # the standard protocol: every entity a candidate, known true ones (the positive's own slot
    # included) removed, the positive scored on its own
    n = 6
    rng = np.random.default_rng(batch_seed)
    batch = edges[: 5] or [(0, 0, 1)]
    scores = torch.tensor(rng.integers(0, 4, (len(batch), n)), dtype=torch.float32)  # ties are common
    pos = torch.tensor([float(scores[i, t]) for i, (_, _, t) in enumerate(batch)])
    index = FilterIndex(*_arrays(edges))
    lhs, rel, rhs = (torch.tensor([e[i] for e in batch]) for i in range(3))
    exclude = index.mask("rhs", lhs, rel, rhs, num_entities=n, include_positive=True)
    got = ranks(pos, scores, exclude).tolist()
    known = set(edges)
    for i, (h, r, t) in enumerate(batch):
        filtered = [float(scores[i, c]) for c in range(n) if c != t and (h, r, c) not in known]
        assert got[i] == 1 + sum(s >= float(pos[i]) for s in filtered)


def test_filter_index_static_relation_and_bad_input() -> None:
    index = FilterIndex([0, 0, 1], [1, 1, 1], [1, 2, 2])
    assert index.num_edges == 3
    got = index.mask("rhs", torch.tensor([0, 1]), 1, torch.tensor([1, 0]), num_entities=3)
    assert got.tolist() == [[False, False, True], [False, False, True]]
    assert not index.mask("rhs", torch.tensor([0]), 0, torch.tensor([1]), num_entities=3).any()
    assert not index.mask("lhs", torch.tensor([9]), 1, torch.tensor([9]), num_entities=3).any()
    empty = FilterIndex.from_edges()
    assert not empty.mask("lhs", torch.tensor([0]), 0, torch.tensor([0]), num_entities=2).any()
    assert empty.mask("lhs", torch.tensor([0]), 0, torch.tensor([0]), candidates=torch.tensor([0, 1])).shape == (1, 2)
    with pytest.raises(ValueError, match="num_entities"):
        index.mask("rhs", torch.tensor([0]), 1, torch.tensor([1]))
    with pytest.raises(ValueError, match="differ in length"):
        FilterIndex([0], [0, 1], [0])
    with pytest.raises(ValueError, match="non-negative"):
        FilterIndex([-1], [0], [0])


def test_filter_index_at_fb15k_scale() -> None:
    rng = np.random.default_rng(0)
    n, num_edges = 14_541, 310_000
    lhs_a, rel_a, rhs_a = rng.integers(0, n, num_edges), rng.integers(0, 12, num_edges), rng.integers(0, n, num_edges)
    index = FilterIndex(lhs_a, rel_a, rhs_a)
    pick = rng.integers(0, num_edges, 1000)
    lhs, rel, rhs = (torch.from_numpy(a[pick]) for a in (lhs_a, rel_a, rhs_a))
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        mask = index.mask("lhs", lhs, rel, rhs, num_entities=n)
        best = min(best, time.perf_counter() - start)
    assert best < 0.5, f"masking 1,000 × {n:,} candidates took {best:.2f} s"
    by_query: dict[tuple[int, int], set[int]] = {}
    for h, r, t in zip(lhs_a.tolist(), rel_a.tolist(), rhs_a.tolist(), strict=True):
        by_query.setdefault((t, r), set()).add(h)
    assert int(mask.sum()) > 0
    for i in range(0, 1000, 50):
        expected = by_query[(int(rhs[i]), int(rel[i]))] - {int(lhs[i])}
        assert set(mask[i].nonzero().squeeze(1).tolist()) == expected
