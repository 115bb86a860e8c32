"""Losses against direct formulas: plain, per-edge weighted, split in blocks, without positives or negatives."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from pbgtrain.model import MASKED_SCORE, make_loss

NAMES = ["ranking", "logistic", "softmax"]
MARGIN = 0.3


def _ref_loss(name: str, pos: Tensor, neg: Tensor, weight: Tensor | None) -> Tensor:
    """Sum over edges of the per-edge loss, written out term by term."""
    total = pos.new_zeros(())
    num_neg = neg.shape[1]
    for i in range(pos.shape[0]):
        if name == "ranking":
            term = sum((torch.clamp(MARGIN - pos[i] + neg[i, k], min=0) for k in range(num_neg)), pos.new_zeros(()))
        elif name == "logistic":
            term = -torch.log(torch.sigmoid(pos[i]))
            if num_neg:
                term = term + sum(-torch.log(1 - torch.sigmoid(neg[i, k])) for k in range(num_neg)) / num_neg
        else:
            if num_neg == 0:
                term = pos.new_zeros(())
            else:
                denominator = torch.exp(pos[i]) + sum(torch.exp(neg[i, k]) for k in range(num_neg))
                term = -torch.log(torch.exp(pos[i]) / denominator)
        total = total + (term if weight is None else term * weight[i])
    return total


@pytest.mark.parametrize("name", NAMES)
@given(num_pos=st.integers(0, 5), num_neg=st.integers(0, 6), weighted=st.booleans(), masked=st.booleans(),
       cuts=st.lists(st.integers(0, 6), max_size=2), seed=st.integers(0, 2**31 - 1))
def test_loss_matches_reference(name: str, num_pos: int, num_neg: int, weighted: bool, masked: bool,
                                cuts: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    pos = (2 * torch.randn(num_pos, generator=gen, dtype=torch.float64)).requires_grad_(True)
    neg_values = 2 * torch.randn(num_pos, num_neg, generator=gen, dtype=torch.float64)
    if masked and num_neg:
        neg_values[:, 0] = MASKED_SCORE
    neg = neg_values.requires_grad_(True)
    weight = torch.rand(num_pos, generator=gen, dtype=torch.float64) * 2 if weighted else None
    pos_ref, neg_ref = pos.detach().clone().requires_grad_(True), neg.detach().clone().requires_grad_(True)
    bounds = sorted({0, num_neg, *(min(c, num_neg) for c in cuts)})
    blocks = [neg[:, a:b] for a, b in itertools.pairwise(bounds)] or [neg]
    loss = make_loss(name, margin=MARGIN)(pos, blocks, weight)
    ref = _ref_loss(name, pos_ref, neg_ref, weight)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(make_loss(name, margin=MARGIN)(pos, neg, weight), ref)
    loss.backward()
    if ref.requires_grad:
        ref.backward()
    for got, want in ((pos, pos_ref), (neg, neg_ref)):
        zeros = torch.zeros_like(got)
        torch.testing.assert_close(zeros if got.grad is None else got.grad, zeros if want.grad is None else want.grad)


@pytest.mark.parametrize("name", NAMES)
def test_no_positives_gives_zero_and_a_valid_backward(name: str) -> None:
    pos = torch.zeros(0, requires_grad=True)
    loss = make_loss(name)(pos, torch.zeros(0, 4))
    assert loss.item() == 0.0
    loss.backward()


@pytest.mark.parametrize(("name", "expected"), [("ranking", 0.0), ("softmax", 0.0),
                                                ("logistic", 2 * math.log1p(math.exp(-1.0)))])
def test_no_negatives(name: str, expected: float) -> None:
    pos = torch.tensor([1.0, 1.0], requires_grad=True)
    loss = make_loss(name)(pos, torch.zeros(2, 0))
    assert loss.item() == pytest.approx(expected)
    loss.backward()


def test_masked_negatives_do_not_count_for_ranking_and_softmax() -> None:
    pos = torch.tensor([0.5])
    neg = torch.tensor([[0.2, MASKED_SCORE, MASKED_SCORE]])
    for name in ("ranking", "softmax"):
        torch.testing.assert_close(make_loss(name)(pos, neg), make_loss(name)(pos, neg[:, :1]))


def test_softmax_is_stable_for_large_scores() -> None:
    pos = torch.tensor([1000.0, -1000.0], requires_grad=True)
    neg = torch.tensor([[990.0, 1001.0], [-995.0, -2000.0]], requires_grad=True)
    loss = make_loss("softmax")(pos, neg)
    expected = torch.logsumexp(torch.tensor([1000.0, 990.0, 1001.0]), 0) - 1000.0
    expected = expected + torch.logsumexp(torch.tensor([-1000.0, -995.0, -2000.0]), 0) + 1000.0
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert pos.grad is not None and torch.isfinite(pos.grad).all()


def test_softmax_backward_twice_fails_loudly() -> None:
    pos = torch.tensor([0.5], requires_grad=True)
    loss = make_loss("softmax")(pos, torch.tensor([[0.1, 0.2]], requires_grad=True))
    loss.backward(retain_graph=True)
    with pytest.raises(AttributeError):
        loss.backward()


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="expected pos"):
        make_loss("softmax")(torch.zeros(2), torch.zeros(3, 1))
    with pytest.raises(ValueError, match="expected weight"):
        make_loss("softmax")(torch.zeros(2), torch.zeros(2, 1), torch.ones(3))
    with pytest.raises(ValueError, match="unknown loss"):
        make_loss("hinge")


@pytest.mark.slow  # torch.compile compiles them first: about 15 s without inductor's cache
def test_compiled_elementwise_passes_match_the_eager_reference() -> None:
    """--compile hands the same functions to torch.compile (a score-matrix head holding
    ``compiled_kernels()``): loss, gradients and violators agree with the eager passes, for one and
    two blocks and for a masked (−1e9) entry (dynamic shapes: two sizes)."""
    from pbgtrain.model.score_kernels import EAGER, compiled_kernels, violators

    gen = torch.Generator().manual_seed(0)
    cases = []
    for rows, widths in ((7, (5,)), (9, (4, 6))):
        pos = torch.randn(rows, generator=gen, dtype=torch.float64)
        blocks = [torch.randn(rows, w, generator=gen, dtype=torch.float64) for w in widths]
        blocks[0][0, 0] = MASKED_SCORE
        cases.append((pos, blocks))
    results = {}
    for kernels in (EAGER, compiled_kernels()):
        out = []
        for pos, blocks in cases:
            value, d_pos, d_blocks = make_loss("softmax").value_and_grad(pos, tuple(blocks), None, kernels)
            count = kernels.violators(pos, blocks)
            out.append((value, [d_pos, *d_blocks], int(count)))
        results[kernels.name] = out
    for (loss_e, grads_e, count_e), (loss_c, grads_c, count_c) in zip(results["eager"], results["compiled"],
                                                                      strict=True):
        torch.testing.assert_close(loss_c, loss_e)
        for c, e in zip(grads_c, grads_e, strict=True):
            torch.testing.assert_close(c, e)
        assert count_c == count_e
    pos, blocks = cases[1]
    assert results["eager"][1][2] == int(violators(pos, blocks))
