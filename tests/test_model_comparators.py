"""Comparators (with and without bias) against direct per-pair reference computations."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from pbgtrain.model import make_comparator

NAMES = ["dot", "cos", "l2", "squared_l2"]


def _ref_prepare(name: str, bias: bool, x: Tensor) -> Tensor:
    if name != "cos":
        return x
    if x.numel() == 0:
        return x
    start = 1 if bias else 0
    rows = []
    for row in x.reshape(-1, x.shape[-1]):
        body = row[start:]
        norm = torch.sqrt(sum(v * v for v in body))
        rows.append(torch.cat([row[:start], body / norm]))
    return torch.stack(rows).view(x.shape)


def _ref_score(name: str, bias: bool, a: Tensor, b: Tensor) -> Tensor:
    """One pair of prepared vectors, from the definitions."""
    start = 1 if bias else 0
    ab = sum(a[k] * b[k] for k in range(start, a.shape[0]))
    sq = sum((a[k] - b[k]) ** 2 for k in range(start, a.shape[0]))
    if name in ("dot", "cos"):
        score = ab
    elif name == "l2":
        score = -torch.sqrt(torch.clamp(sq, min=1e-30))
    else:
        score = -sq
    return score + (a[0] + b[0] if bias else 0)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("name", NAMES)
@given(m=st.integers(1, 4), n=st.integers(0, 4), dim=st.integers(2, 6), lead=st.integers(0, 2),
       seed=st.integers(0, 2**31 - 1))
def test_comparator_matches_reference(name: str, bias: bool, m: int, n: int, dim: int, lead: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch = (lead,) if lead else ()
    a = torch.randn(*batch, m, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(*batch, n, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    c = torch.randn(*batch, m, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    a_ref, b_ref, c_ref = (t.detach().clone().requires_grad_(True) for t in (a, b, c))
    cmp = make_comparator(name, bias)
    pa, pb, pc = cmp.prepare(a), cmp.prepare(b), cmp.prepare(c)
    all_pairs, pair = cmp.all_pairs(pa, pb), cmp.pair(pa, pc)
    ra, rb, rc = (_ref_prepare(name, bias, t) for t in (a_ref, b_ref, c_ref))
    flat = (max(lead, 1), m, n)
    ra3, rb3, rc3 = ra.reshape(flat[0], m, dim), rb.reshape(flat[0], n, dim), rc.reshape(flat[0], m, dim)
    ref_all = torch.stack([torch.stack([torch.stack([_ref_score(name, bias, ra3[g, i], rb3[g, j])
                                                     for j in range(n)]) if n else torch.zeros(0, dtype=a.dtype)
                                        for i in range(m)]) for g in range(flat[0])]).view(*batch, m, n)
    ref_pair = torch.stack([torch.stack([_ref_score(name, bias, ra3[g, i], rc3[g, i]) for i in range(m)])
                            for g in range(flat[0])]).view(*batch, m)
    torch.testing.assert_close(all_pairs, ref_all)
    torch.testing.assert_close(pair, ref_pair)
    w_all = torch.randn(all_pairs.shape, generator=gen, dtype=torch.float64)
    w_pair = torch.randn(pair.shape, generator=gen, dtype=torch.float64)
    ((all_pairs * w_all).sum() + (pair * w_pair).sum()).backward()
    ((ref_all * w_all).sum() + (ref_pair * w_pair).sum()).backward()
    for got, want in ((a, a_ref), (b, b_ref), (c, c_ref)):
        zeros = torch.zeros_like(got)
        torch.testing.assert_close(zeros if got.grad is None else got.grad, zeros if want.grad is None else want.grad)


@pytest.mark.parametrize("name", NAMES)
def test_comparators_are_symmetric(name: str) -> None:
    cmp = make_comparator(name, bias=True)
    a, b = cmp.prepare(torch.randn(3, 5)), cmp.prepare(torch.randn(4, 5))
    torch.testing.assert_close(cmp.all_pairs(a, b), cmp.all_pairs(b, a).T)


def test_l2_clamps_identical_vectors() -> None:
    cmp = make_comparator("l2")
    a = torch.tensor([[1.0, 2.0]], requires_grad=True)
    score = cmp.pair(a, a.detach())
    assert score.item() == pytest.approx(-math.sqrt(1e-30))
    score.sum().backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()


def test_cos_prepare_normalises_and_bias_keeps_coordinate_zero() -> None:
    x = torch.tensor([[3.0, 3.0, 4.0]])
    torch.testing.assert_close(make_comparator("cos").prepare(x).norm(dim=-1), torch.ones(1))
    torch.testing.assert_close(make_comparator("cos", bias=True).prepare(x), torch.tensor([[3.0, 0.6, 0.8]]))
    assert torch.equal(make_comparator("cos").prepare(torch.zeros(1, 3)), torch.zeros(1, 3))


def test_unknown_comparator() -> None:
    with pytest.raises(ValueError, match="unknown comparator"):
        make_comparator("manhattan")


@pytest.mark.parametrize("name", ["dot", "cos", "l2", "squared_l2"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("scores_of", "rows_of_b", "seed"), [("all_pairs", 3, 0), ("pair", 4, 1)])
def test_grads_are_the_adjoints_of_the_scores(name: str, bias: bool, scores_of: str, rows_of_b: int,
                                              seed: int) -> None:
    """pair_grad and all_pairs_grad give what autograd gives through pair and all_pairs, batched
    over a leading axis and with the clamped (coincident) pairs of l2 taking no gradient."""
    cmp = make_comparator(name, bias=bias)
    score, adjoint = getattr(cmp, scores_of), getattr(cmp, f"{scores_of}_grad")
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, rows_of_b, 5, generator=gen, dtype=torch.float64)
    b[:, 0] = a[:, 0].detach()  # a pair at distance 0
    b.requires_grad_(True)
    scores = score(a, b)
    grad = torch.randn(scores.shape, generator=gen, dtype=torch.float64)
    expected = torch.autograd.grad(scores, (a, b), grad)
    got = adjoint(a.detach(), b.detach(), scores.detach(), grad)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)
