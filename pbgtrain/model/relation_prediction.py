"""Relation prediction: an auxiliary training objective (``pbgtrain fit --relation-prediction W``).

Besides ranking entities, each positive edge ``(u, r, v)`` also scores every relation for its pair
and adds ``W`` times that cross-entropy to the loss (Chen et al. 2021, "Relation Prediction as an
Auxiliary Training Objective for Improving Multi-Relational Graph Representations"). With dynamic
relations each side has its own operators (the reciprocal relations of the format): the lhs side
scores ``cmp(h_ρ(v), u)`` and the rhs side ``cmp(g_ρ(u), v)`` for every relation ρ, and each side's
softmax over ρ is asked for ``r``. Only training changes: no parameter is added, so a checkpoint
trained with it is an ordinary one.

Two ways to the scores of every relation, each with its gradients by hand as the rest of the
step's (a test holds both to autograd):

- **bilinear** (:data:`BILINEAR`): with the dot comparator, the diagonal, complex-diagonal and
  translation operators score ``features(x, y) · w_ρ`` (plus a term the same for every ρ, which
  the softmax cancels), ``w_ρ`` the relation's parameters: one ``[B, P] × [P, R]`` product;
- **expanded**, every other operator and comparator: each side's chain (:mod:`pbgtrain.model.chains`:
  the operator, the comparator's ``prepare``) runs on the query rows repeated once per relation, a
  chunk of edges at a time (:data:`CHUNK_ELEMENTS` bounds the repeated rows).

>>> from pbgtrain.model.model import EmbeddingModel, ModelSpec, RelationSpec
>>> spec = ModelSpec({"e": 4}, (RelationSpec("r", "e", "e", operator="complex_diagonal"),), num_dynamic_rels=3,
...                  comparator="dot", global_emb=False)
>>> model = EmbeddingModel(spec)
>>> u, v = torch.ones(2, 4), torch.ones(2, 4)
>>> loss, du, dv = relation_prediction_and_grads(model, torch.tensor([0, 2]), u, v, None, 1.0)
>>> round(float(loss), 4), du.shape  # identity operators: every relation scores alike, 2 · 2 · log 3
(4.3944, torch.Size([2, 4]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from pbgtrain.model.chains import Chain, dynamic_operator_link, prepare_link
from pbgtrain.model.comparators import Comparator, DotComparator
from pbgtrain.model.complex_ops import complex_multiply
from pbgtrain.model.model import EmbeddingModel
from pbgtrain.model.operators import (
    ComplexDiagonalDynamicOperator,
    DiagonalDynamicOperator,
    DynamicOperator,
    TranslationDynamicOperator,
    add_grad,
)

CHUNK_ELEMENTS = 1 << 22
"""Most elements of the query rows repeated per relation at once (16 MiB of float32)."""


@torch.no_grad()
def relation_prediction_and_grads(model: EmbeddingModel, rel: Tensor, u_raw: Tensor, v_raw: Tensor,
                                  weight: Tensor | None, coef: float) -> tuple[Tensor, Tensor, Tensor]:
    """``coef`` · Σ over the edges and both sides of the relation cross-entropy (each edge's term
    times its ``weight``), and its gradients in ``u_raw`` and ``v_raw`` [B, D] (the lhs and rhs rows
    of the edges); the operators' parameters' gradients are added to their ``.grad``."""
    g_op, h_op = model.dynamic_operators()
    scale = torch.full((len(rel),), coef, device=u_raw.device) if weight is None else weight * coef
    lhs_side = _side_term(model.comparator, h_op, rel, v_raw, u_raw, scale)  # cmp(h_ρ(v), u)
    rhs_side = _side_term(model.comparator, g_op, rel, u_raw, v_raw, scale)  # cmp(g_ρ(u), v)
    return lhs_side[0] + rhs_side[0], lhs_side[2] + rhs_side[1], lhs_side[1] + rhs_side[2]


def _cross_entropy(logits: Tensor, target: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """Σ scale · cross-entropy of each row of ``logits`` [B, R] against ``target``, and its
    gradient in the logits."""
    log_p = torch.log_softmax(logits, dim=1)
    loss = -(log_p.gather(1, target.unsqueeze(1)).squeeze(1) * scale).sum()
    d_logits = log_p.exp_().sub_(F.one_hot(target, logits.shape[1]).to(log_p.dtype)).mul_(scale.unsqueeze(1))
    return loss, d_logits


def _side_term(cmp: Comparator, op: DynamicOperator, rel: Tensor, query_raw: Tensor, other_raw: Tensor,
               scale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One side: the loss of ``cmp(op_ρ(query), other)`` over ρ, and the gradients of the query
    and other rows."""
    form = BILINEAR.get(type(op)) if type(cmp) is DotComparator else None
    if form is not None:
        return _bilinear_term(form, op, rel, query_raw, other_raw, scale)
    return _expanded_term(cmp, op, rel, query_raw, other_raw, scale)


def _bilinear_term(form: BilinearForm, op: DynamicOperator, rel: Tensor, x: Tensor, y: Tensor,
                   scale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    features = form.features(x, y)
    weights = form.weights(op)
    loss, d_logits = _cross_entropy(features @ weights.t(), rel, scale)
    form.add_weights_grad(op, d_logits.t() @ features)
    dx, dy = form.features_grad(x, y, d_logits @ weights)
    return loss, dx, dy


def _expanded_term(cmp: Comparator, op: DynamicOperator, rel: Tensor, query_raw: Tensor, other_raw: Tensor,
                   scale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    num_relations = op.num_relations
    prepare = prepare_link(cmp)
    other = Chain.of(prepare).trace(other_raw)
    edges, dim = query_raw.shape
    chunk = max(1, CHUNK_ELEMENTS // max(num_relations * dim, 1))
    every_relation = torch.arange(num_relations, device=query_raw.device)
    loss = query_raw.new_zeros(())
    d_query, d_other = torch.empty_like(query_raw), torch.empty_like(other.out)
    for start in range(0, edges, chunk):
        end = min(start + chunk, edges)
        count = end - start
        rels = every_relation.repeat(count)
        chain = Chain.of(dynamic_operator_link(op, rels), prepare)
        queries = chain.trace(query_raw[start:end].repeat_interleave(num_relations, 0))
        others = other.out[start:end].repeat_interleave(num_relations, 0)
        scores = cmp.pair(queries.out, others)
        chunk_loss, d_logits = _cross_entropy(scores.view(count, num_relations), rel[start:end], scale[start:end])
        loss = loss + chunk_loss
        d_queries, d_others = cmp.pair_grad(queries.out, others, scores, d_logits.view(-1))
        d_query[start:end] = queries.backward(d_queries).view(count, num_relations, dim).sum(1)
        d_other[start:end] = d_others.view(count, num_relations, dim).sum(1)
    return loss, d_query, other.backward(d_other)


class BilinearForm(Protocol):
    """An operator whose dot score is ``features(x, y) · w_ρ`` plus a term the same for every ρ."""

    def features(self, x: Tensor, y: Tensor) -> Tensor:
        """[B, P] of the query rows ``x`` (before the operator) and the other side's ``y``."""

    def features_grad(self, x: Tensor, y: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """The gradients of ``x`` and ``y`` from ``grad``, the gradient of the features."""

    def weights(self, op: DynamicOperator) -> Tensor:
        """[R, P]: each relation's parameters, in the features' order."""

    def add_weights_grad(self, op: DynamicOperator, grad: Tensor) -> None:
        """Add ``grad`` [R, P] to the parameters' ``.grad``."""


@dataclass(frozen=True)
class _Diagonal:
    """``(x ⊙ d_ρ) · y = (x ⊙ y) · d_ρ``."""

    def features(self, x: Tensor, y: Tensor) -> Tensor:
        return x * y

    def features_grad(self, x: Tensor, y: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        return grad * y, grad * x

    def weights(self, op: DynamicOperator) -> Tensor:
        assert isinstance(op, DiagonalDynamicOperator)
        return op.diagonals.detach()

    def add_weights_grad(self, op: DynamicOperator, grad: Tensor) -> None:
        assert isinstance(op, DiagonalDynamicOperator)
        add_grad(op.diagonals, grad)


@dataclass(frozen=True)
class _ComplexDiagonal:
    """``Re⟨x · (a_ρ + i b_ρ), y⟩ = a_ρ · (x_re y_re + x_im y_im) + b_ρ · (x_re y_im − x_im y_re)``,
    halves ``[re | im]`` as the operator keeps them."""

    def features(self, x: Tensor, y: Tensor) -> Tensor:  # conj(x) · y
        half = x.shape[1] // 2
        return complex_multiply(y, x[:, :half], -x[:, half:])

    def features_grad(self, x: Tensor, y: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        half = x.shape[1] // 2
        a, b = grad[:, :half], grad[:, half:]
        return complex_multiply(y, a, -b), complex_multiply(x, a, b)  # conj(g) · y, g · x

    def weights(self, op: DynamicOperator) -> Tensor:
        assert isinstance(op, ComplexDiagonalDynamicOperator)
        return torch.cat((op.real.detach(), op.imag.detach()), dim=1)

    def add_weights_grad(self, op: DynamicOperator, grad: Tensor) -> None:
        assert isinstance(op, ComplexDiagonalDynamicOperator)
        half = grad.shape[1] // 2
        add_grad(op.real, grad[:, :half].contiguous())
        add_grad(op.imag, grad[:, half:].contiguous())


@dataclass(frozen=True)
class _Translation:
    """``(x + t_ρ) · y = t_ρ · y + x · y`` (the last term the same for every ρ: no gradient)."""

    def features(self, x: Tensor, y: Tensor) -> Tensor:
        return y

    def features_grad(self, x: Tensor, y: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        return torch.zeros_like(x), grad

    def weights(self, op: DynamicOperator) -> Tensor:
        assert isinstance(op, TranslationDynamicOperator)
        return op.translations.detach()

    def add_weights_grad(self, op: DynamicOperator, grad: Tensor) -> None:
        assert isinstance(op, TranslationDynamicOperator)
        add_grad(op.translations, grad)


BILINEAR: dict[type[DynamicOperator], BilinearForm] = {
    DiagonalDynamicOperator: _Diagonal(),
    ComplexDiagonalDynamicOperator: _ComplexDiagonal(),
    TranslationDynamicOperator: _Translation(),
}
"""The operators scored by one product with the dot comparator (the others are expanded)."""
