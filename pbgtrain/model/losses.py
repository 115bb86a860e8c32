"""Loss functions of positive scores [B] against negative scores [B, K], summed over the batch
(any leading axes may come before B: the sides of a batch scored together are [S, B]).

Per edge (``w`` the optional per-edge weight, 1 without):

- ranking: ``w · Σ_k max(0, margin − pos + neg_k)``;
- logistic: ``w · (BCE(pos, 1) + (1/K) Σ_k BCE(neg_k, 0))`` (the neg term is 0 when K = 0);
- softmax: ``w · CE([pos, logsumexp(neg)], 0) = w · softplus(logsumexp(neg) − pos)``.

Ranking and softmax are 0 when there are no negatives; every loss is 0 without positives.
Masked negatives (−1e9) contribute nothing to ranking or softmax (they still count in the
logistic ``1/K``, as in the original). Negative scores may be given as one [B, K] tensor or as
column blocks [B, K_i] (the same as their concatenation, without building it).

>>> pos, neg = torch.tensor([1.0]), torch.tensor([[0.5, 2.0]])
>>> round(make_loss("ranking", margin=0.1)(pos, neg).item(), 4)
1.1
>>> round(make_loss("softmax")(pos, [neg[:, :1], neg[:, 1:]]).item(), 4)
1.4644
>>> make_loss("softmax")(pos, neg[:, :0]).item()
0.0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from pbgtrain.model.score_kernels import EAGER, Kernels

NegativeScores = Tensor | Sequence[Tensor]


def _weighted_sum(per_edge: Tensor, weight: Tensor | None) -> Tensor:
    return (per_edge * weight).sum() if weight is not None else per_edge.sum()


def _zero(pos: Tensor) -> Tensor:
    """A differentiable zero (keeps ``backward`` valid when a side has nothing to score)."""
    return 0 * pos.sum()


class LossFunction:
    name = ""

    def __call__(self, pos: Tensor, neg: NegativeScores, weight: Tensor | None = None) -> Tensor:
        blocks = (neg,) if isinstance(neg, Tensor) else tuple(neg)
        if pos.dim() < 1 or any(b.shape[:-1] != pos.shape or b.dim() != pos.dim() + 1 for b in blocks):
            raise ValueError(f"expected pos [B] and negatives [B, K], found {tuple(pos.shape)} and "
                             f"{[tuple(b.shape) for b in blocks]}")
        if weight is not None and weight.shape != pos.shape[-1:]:
            raise ValueError(f"expected weight [{pos.shape[-1]}], found {tuple(weight.shape)}")
        blocks = tuple(b for b in blocks if b.shape[-1] > 0)
        return self.loss(pos, blocks, weight)

    def loss(self, pos: Tensor, blocks: tuple[Tensor, ...], weight: Tensor | None) -> Tensor:
        raise NotImplementedError

    def value_and_grad(self, pos: Tensor, blocks: tuple[Tensor, ...], weight: Tensor | None,
                       kernels: Kernels = EAGER) -> tuple[Tensor, Tensor, list[Tensor | None]]:
        """The loss (detached) and its gradients in ``pos`` and each block (None for an empty
        block), at once: what a training step needs when the scores are not recorded for
        autograd. This default differentiates :meth:`loss`; a loss may do it by hand (softmax,
        with ``kernels``' passes)."""
        with torch.enable_grad():
            pos_leaf = pos.detach().requires_grad_(True)
            leaves = [b.detach().requires_grad_(True) for b in blocks]
            value = self(pos_leaf, leaves, weight)
            grads = torch.autograd.grad(value, [pos_leaf, *leaves], allow_unused=True, materialize_grads=True)
        return value.detach(), grads[0], [g.contiguous() if b.shape[-1] else None
                                          for g, b in zip(grads[1:], blocks, strict=True)]


class RankingLoss(LossFunction):
    name = "ranking"

    def __init__(self, margin: float) -> None:
        self.margin = margin

    def loss(self, pos: Tensor, blocks: tuple[Tensor, ...], weight: Tensor | None) -> Tensor:
        if not blocks or pos.numel() == 0:
            return _zero(pos)
        threshold = (pos - self.margin).unsqueeze(-1)
        per_edge = sum((F.relu(b - threshold).sum(-1) for b in blocks), pos.new_zeros(pos.shape))
        return _weighted_sum(per_edge, weight)


class LogisticLoss(LossFunction):
    name = "logistic"

    def loss(self, pos: Tensor, blocks: tuple[Tensor, ...], weight: Tensor | None) -> Tensor:
        per_edge = F.softplus(-pos)
        num_neg = sum(b.shape[-1] for b in blocks)
        if num_neg:
            per_edge = per_edge + sum((F.softplus(b).sum(-1) for b in blocks), pos.new_zeros(pos.shape)) / num_neg
        return _weighted_sum(per_edge, weight)


class _SoftmaxPerEdge(torch.autograd.Function):
    """softplus(logsumexp(blocks) − pos) per edge; keeps exp(neg − max) from the forward for the
    backward, which scales it in place (one pass, no recomputation, no concatenation). The two
    halves are :func:`pbgtrain.model.score_kernels.softmax_forward`/``softmax_backward``."""

    @staticmethod
    def forward(ctx: Any, pos: Tensor, *blocks: Tensor) -> Tensor:
        gap, total, exps = EAGER.softmax_forward(pos, list(blocks))
        ctx.save_for_backward(gap, total)
        ctx.exps = exps
        return F.softplus(gap)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        gap, total = ctx.saved_tensors
        exps: list[Tensor] = ctx.exps
        del ctx.exps  # consumed: a second backward through this node fails loudly
        d_pos, d_blocks = EAGER.softmax_backward(gap, total, exps, grad)
        return (d_pos, *d_blocks)


class SoftmaxLoss(LossFunction):
    name = "softmax"

    def loss(self, pos: Tensor, blocks: tuple[Tensor, ...], weight: Tensor | None) -> Tensor:
        if not blocks or pos.numel() == 0:
            return _zero(pos)
        per_edge: Tensor = _SoftmaxPerEdge.apply(pos, *blocks)  # type: ignore[no-untyped-call]
        return _weighted_sum(per_edge, weight)

    def value_and_grad(self, pos: Tensor, blocks: tuple[Tensor, ...], weight: Tensor | None,
                       kernels: Kernels = EAGER) -> tuple[Tensor, Tensor, list[Tensor | None]]:
        live = [b for b in blocks if b.shape[-1] > 0]
        if not live or pos.numel() == 0:
            return pos.new_zeros(()), torch.zeros_like(pos), [None for _ in blocks]
        gap, total, exps = kernels.softmax_forward(pos, live)
        value = _weighted_sum(F.softplus(gap), weight)
        d_pos, d_live = kernels.softmax_backward(gap, total, exps, weight)
        found = iter(d_live)
        return value, d_pos, [next(found) if b.shape[-1] > 0 else None for b in blocks]


def make_loss(name: str, margin: float = 0.1) -> LossFunction:
    """The loss ``name`` (ranking, logistic, softmax); ``margin`` is used by ranking only."""
    if name == "ranking":
        return RankingLoss(margin)
    if name == "logistic":
        return LogisticLoss()
    if name == "softmax":
        return SoftmaxLoss()
    raise ValueError(f"unknown loss {name!r}; expected one of ['logistic', 'ranking', 'softmax']")
