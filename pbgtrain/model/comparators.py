"""Comparators: the similarity of two prepared embeddings (higher is more similar).

A comparator has three parts: ``prepare`` (run once per embedding, after the operator; cos
L2-normalises here), ``pair`` (row-wise scores of matching rows) and ``all_pairs`` (every row of
one set against every row of another, batched over leading axes), with its adjoint
``all_pairs_grad`` (the gradients of both sets from the scores' gradient, which the step's
negative scoring uses instead of recording ``all_pairs`` for autograd). All four comparators are
symmetric, so which side is the query does not matter. With ``bias=True`` coordinate 0 is an
additive bias on both sides and the base comparator sees coordinates 1:.

>>> dot = make_comparator("dot")
>>> a, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0], [0.0, 1.0]])
>>> dot.all_pairs(a, b).tolist()
[[11.0, 2.0]]
>>> make_comparator("dot", bias=True).all_pairs(a, b).tolist()
[[12.0, 3.0]]
>>> make_comparator("squared_l2").pair(a, b[:1]).tolist()
[-8.0]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

L2_CLAMP = 1e-30
COS_NORM_CLAMP = 1e-30


class Comparator:
    """Base comparator: dot product."""

    name = "dot"
    #: ``all_pairs`` is a plain matrix product of the prepared embeddings (scoring may then use
    #: the fused kernels of :mod:`pbgtrain.model.complex_ops`)
    all_pairs_is_dot = True
    #: ``all_pairs_grad`` reads the scores (a distance's derivative depends on the distance)
    grad_reads_scores = False
    #: ``prepare`` changes its input (else it returns it as it is, and the step skips it)
    prepares = False

    def prepare(self, x: Tensor) -> Tensor:
        return x

    def prepare_grad(self, x: Tensor, grad: Tensor) -> Tensor:
        """The gradient of ``x`` from ``grad``, the gradient of ``prepare(x)``."""
        return grad

    def pair(self, a: Tensor, b: Tensor) -> Tensor:
        """Scores of row i of ``a`` with row i of ``b``: [..., D] × [..., D] → [...]."""
        return (a * b).sum(-1)

    def pair_grad(self, a: Tensor, b: Tensor, scores: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """The gradients of ``a`` and ``b`` from ``grad``, the gradient of ``scores = pair(a, b)``."""
        g = grad.unsqueeze(-1)
        return b * g, a * g

    def all_pairs(self, a: Tensor, b: Tensor) -> Tensor:
        """Scores of every row of ``a`` with every row of ``b``: [..., M, D] × [..., N, D] → [..., M, N]."""
        return _product(a, b.transpose(-1, -2))

    def all_pairs_grad(self, a: Tensor, b: Tensor, scores: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """The gradients of ``a`` and ``b`` (same leading axes as ``scores``) from ``grad``, the
        gradient of ``scores = all_pairs(a, b)``."""
        return _product(grad, b), _product(grad.transpose(-1, -2), a)


def _product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b``: ``mm``/``bmm`` straight away where the shapes allow (``matmul`` dispatches
    reshapes and expansions around them), else ``matmul``."""
    if a.dim() == b.dim() == 2:
        return torch.mm(a, b)
    if a.dim() == b.dim() == 3 and a.shape[0] == b.shape[0]:
        return torch.bmm(a, b)
    return torch.matmul(a, b)


class DotComparator(Comparator):
    name = "dot"


class CosComparator(Comparator):
    """Cosine similarity: L2-normalise in ``prepare``, then dot (a zero vector stays zero)."""

    name = "cos"
    prepares = True

    def prepare(self, x: Tensor) -> Tensor:
        norm: Tensor = x.norm(dim=-1, keepdim=True)
        return x / norm.clamp_min(COS_NORM_CLAMP)

    def prepare_grad(self, x: Tensor, grad: Tensor) -> Tensor:
        # y = x / max(|x|, c): (g − y (y·g)) / |x| where the norm is not clamped, g / c where it is
        norm = x.norm(dim=-1, keepdim=True)
        scale = norm.clamp_min(COS_NORM_CLAMP)
        y = x / scale
        along = (y * grad).sum(-1, keepdim=True)
        return torch.where(norm >= COS_NORM_CLAMP, (grad - y * along) / scale, grad / scale)


def _squared_distances(a: Tensor, b: Tensor) -> Tensor:
    """|a_i|² + |b_j|² − 2 a_i·b_j for every pair (may dip below 0 by rounding)."""
    a_sq = a.square().sum(-1)
    b_sq = b.square().sum(-1)
    return (a_sq.unsqueeze(-1) + b_sq.unsqueeze(-2)) - 2 * torch.matmul(a, b.transpose(-1, -2))


def _distance_grads(a: Tensor, b: Tensor, per_pair: Tensor) -> tuple[Tensor, Tensor]:
    """Σ_j h_ij (a_i − b_j) and Σ_i h_ij (b_j − a_i): the gradients of a score whose derivative
    in a_i is h_ij · (a_i − b_j)."""
    da = a * per_pair.sum(-1, keepdim=True) - torch.matmul(per_pair, b)
    db = b * per_pair.sum(-2).unsqueeze(-1) - torch.matmul(per_pair.transpose(-1, -2), a)
    return da, db


def _l2_per_pair(scores: Tensor, grad: Tensor) -> Tensor:
    """``grad / score``: d(−√x)/dx · dx/da = (a − b) / score; zero where the distance was clamped."""
    return torch.where(scores >= -math.sqrt(L2_CLAMP), 0.0, grad / scores)


class L2Comparator(Comparator):
    """−‖a − b‖, with the squared distance clamped at 1e-30 before the square root."""

    name = "l2"
    all_pairs_is_dot = False
    grad_reads_scores = True

    def pair(self, a: Tensor, b: Tensor) -> Tensor:
        return -(a - b).square().sum(-1).clamp_min(L2_CLAMP).sqrt()

    def pair_grad(self, a: Tensor, b: Tensor, scores: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        da = (a - b).mul_(_l2_per_pair(scores, grad).unsqueeze(-1))
        return da, -da

    def all_pairs(self, a: Tensor, b: Tensor) -> Tensor:
        return -_squared_distances(a, b).clamp_min(L2_CLAMP).sqrt()

    def all_pairs_grad(self, a: Tensor, b: Tensor, scores: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        return _distance_grads(a, b, _l2_per_pair(scores, grad))


class SquaredL2Comparator(Comparator):
    """−‖a − b‖²."""

    name = "squared_l2"
    all_pairs_is_dot = False

    def pair(self, a: Tensor, b: Tensor) -> Tensor:
        return -(a - b).square().sum(-1)

    def pair_grad(self, a: Tensor, b: Tensor, scores: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        da = (a - b).mul_(grad.unsqueeze(-1) * -2)
        return da, -da

    def all_pairs(self, a: Tensor, b: Tensor) -> Tensor:
        return -_squared_distances(a, b)

    def all_pairs_grad(self, a: Tensor, b: Tensor, scores: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        return _distance_grads(a, b, grad * -2)


class BiasedComparator(Comparator):
    """Coordinate 0 of each side is added to the score; the base sees coordinates 1:."""

    all_pairs_is_dot = False

    def __init__(self, base: Comparator) -> None:
        self.base = base
        self.name = base.name
        self.prepares = base.prepares  # coordinate 0 passes as it is

    def prepare(self, x: Tensor) -> Tensor:
        return torch.cat((x[..., :1], self.base.prepare(x[..., 1:])), dim=-1)

    def prepare_grad(self, x: Tensor, grad: Tensor) -> Tensor:
        return torch.cat((grad[..., :1], self.base.prepare_grad(x[..., 1:], grad[..., 1:])), dim=-1)

    def pair(self, a: Tensor, b: Tensor) -> Tensor:
        return self.base.pair(a[..., 1:], b[..., 1:]) + a[..., 0] + b[..., 0]

    def pair_grad(self, a: Tensor, b: Tensor, scores: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        base_scores = self.base.pair(a[..., 1:], b[..., 1:]) if self.base.grad_reads_scores else scores
        da_rest, db_rest = self.base.pair_grad(a[..., 1:], b[..., 1:], base_scores, grad)
        g = grad.unsqueeze(-1)
        return torch.cat((g, da_rest), dim=-1), torch.cat((g, db_rest), dim=-1)

    def all_pairs(self, a: Tensor, b: Tensor) -> Tensor:
        scores = self.base.all_pairs(a[..., 1:], b[..., 1:])
        return scores + a[..., 0].unsqueeze(-1) + b[..., 0].unsqueeze(-2)

    def all_pairs_grad(self, a: Tensor, b: Tensor, scores: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        # the base's own scores, computed again as in all_pairs: taking the biases back off the sums
        # would round, and a distance near 0 has a derivative that magnifies it
        base_scores = self.base.all_pairs(a[..., 1:], b[..., 1:]) if self.base.grad_reads_scores else scores
        da_rest, db_rest = self.base.all_pairs_grad(a[..., 1:], b[..., 1:], base_scores, grad)
        return (torch.cat((grad.sum(-1).unsqueeze(-1), da_rest), dim=-1),
                torch.cat((grad.sum(-2).unsqueeze(-1), db_rest), dim=-1))


COMPARATORS: dict[str, type[Comparator]] = {
    cls.name: cls for cls in (DotComparator, CosComparator, L2Comparator, SquaredL2Comparator)
}


def make_comparator(name: str, bias: bool = False) -> Comparator:
    """The comparator ``name`` (dot, cos, l2, squared_l2), wrapped for ``bias`` if asked."""
    if name not in COMPARATORS:
        raise ValueError(f"unknown comparator {name!r}; expected one of {sorted(COMPARATORS)}")
    base = COMPARATORS[name]()
    return BiasedComparator(base) if bias else base
