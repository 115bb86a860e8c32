"""The training step's hand-written gradients against autograd's.

Every adjoint the step uses in place of autograd (each operator's ``vjp``, static and dynamic;
each comparator's ``prepare_grad``; a chain of global embedding, operator and ``prepare``; N3's
value and gradients; the leaf's gradient assembled from groups and feature bags) is compared with
``torch.autograd`` on the same forward, in float64. The whole step is compared with an
independent reference in ``tests/test_model_scoring.py`` and ``tests/test_static_shapes.py``.
Both sides of every comparison compute one function in float64 in different orders: they agree
within :data:`TOLERANCE`, a bound of that (not what a machine happened to reach).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

from pbgio.spec.checkpoint import OPERATORS
from pbgtrain.model import EdgeBatch, EmbeddingModel, EntityTable, ModelSpec, NegativeSampling, RelationSpec
from pbgtrain.model.chains import Chain, Prepare, Shift, StaticOperator
from pbgtrain.model.comparators import make_comparator
from pbgtrain.model.gradients import regularization_and_grads, training_gradients
from pbgtrain.model.inputs import FeatureBags
from pbgtrain.model.lookup import GatheredRows, gather_rows
from pbgtrain.model.operators import make_dynamic_operator, make_operator
from pbgtrain.model.scoring import forward_batch, regularization
from pbgtrain.model.step import batch_loss

pytestmark = pytest.mark.step_numerics  # CI runs these again under other CPU kernels (.ci/run)

NAMES = sorted(OPERATORS)
TOLERANCE = 2.0**-30
"""float64's unit roundoff is u = 2⁻⁵³. Every quantity compared here is under 2⁶ operations deep
(an operator's adjoint; a chain of global embedding, operator and ``prepare``; N3's cubes; the
softmax loss's adjoints; the leaf assembled from groups and bags), each a sum of under 2⁶ terms
(rows and coordinates of at most 12 × 6, relations of at most 5), on intermediates within 2⁶ of
the result's scale (standard normal and uniform draws, cubed at most): to first order, two such
evaluations differ by at most 2·2⁶·2⁶·2⁶ u = 2⁻³⁴ of the scale; 2⁻³⁰ relative and absolute (the
scales here are between 2⁻⁴ and 2⁸) leaves a factor 2⁴ for the exponentials' and the square roots'
own errors (a few ulps each) and the second-order terms."""


def _randomize(module: nn.Module, seed: int) -> nn.Module:
    module = module.double()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed), dtype=p.dtype))
    return module


def _grads(module: nn.Module) -> list[Tensor]:
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("name", NAMES)
def test_static_operator_vjp_is_autograds(name: str) -> None:
    op = _randomize(make_operator(name, 6), 1)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    op(x).backward(grad)
    want_x, want_params = x.grad, _grads(op)
    op.zero_grad(set_to_none=True)
    got_x = op.vjp(x.detach(), grad)
    torch.testing.assert_close(got_x, want_x, rtol=TOLERANCE, atol=TOLERANCE)
    for got, want in zip(_grads(op), want_params, strict=True):
        torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("name", NAMES)
def test_dynamic_operator_vjp_is_autograds(name: str) -> None:
    op = _randomize(make_dynamic_operator(name, 6, num_relations=4), 3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(9, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    rel = torch.tensor([0, 2, 2, 3, 0, 2, 3, 3, 2])  # relation 1 unused: its rows get no gradient
    grad = torch.randn(9, 6, generator=gen, dtype=torch.float64)
    op(x, rel).backward(grad)
    want_x, want_params = x.grad, _grads(op)
    op.zero_grad(set_to_none=True)
    got_x = op.vjp(x.detach(), rel, grad)
    torch.testing.assert_close(got_x, want_x, rtol=TOLERANCE, atol=TOLERANCE)
    for got, want in zip(_grads(op), want_params, strict=True):
        torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize(("name", "bias"), [("dot", False), ("cos", False), ("cos", True), ("l2", True)])
def test_prepare_grad_is_autograds(name: str, bias: bool) -> None:
    cmp = make_comparator(name, bias)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    x[2] = 0.0  # a zero vector: cos leaves it at zero, and its gradient is the clamped one
    x.requires_grad_(True)
    grad = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    cmp.prepare(x).backward(grad)
    torch.testing.assert_close(cmp.prepare_grad(x.detach(), grad), x.grad, rtol=TOLERANCE, atol=TOLERANCE)


def test_a_chain_backward_is_autograds_and_adds_to_every_parameter() -> None:
    op = _randomize(make_operator("affine", 4), 6)
    emb = nn.Parameter(torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(7)))
    chain = Chain((Shift(emb), StaticOperator(op), Prepare(make_comparator("cos"))))
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(8), requires_grad=True)
    grad = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    chain(x).backward(grad)
    want = [x.grad, emb.grad, *_grads(op)]
    emb.grad = None
    op.zero_grad(set_to_none=True)
    traced = chain.trace(x.detach())
    torch.testing.assert_close(traced.out, chain(x.detach()), rtol=TOLERANCE, atol=TOLERANCE)
    got = [traced.backward(grad), emb.grad, *_grads(op)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("operator", NAMES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_regularization_and_grads_are_autograds(operator: str, dynamic: bool) -> None:
    spec = ModelSpec({"e": 6}, (RelationSpec("r", "e", "e", operator=operator),),
                     num_dynamic_rels=4 if dynamic else None, comparator="dot", loss_fn="softmax",
                     regularization_coef=0.3, global_emb=not dynamic)
    model = _randomize(EmbeddingModel(spec), 10)
    assert isinstance(model, EmbeddingModel)
    gen = torch.Generator().manual_seed(11)
    u, v = (torch.randn(7, 6, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    rel: int | Tensor = torch.tensor([0, 3, 3, 1, 0, 3, 1]) if dynamic else 0
    want = regularization(model, rel, u, v)
    assert want is not None
    want.backward()
    want_params = _grads(model)
    model.zero_grad(set_to_none=True)
    value, du, dv = regularization_and_grads(model, rel, u.detach(), v.detach())
    torch.testing.assert_close(value, want.detach(), rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(du, u.grad, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(dv, v.grad, rtol=TOLERANCE, atol=TOLERANCE)
    for got, w in zip(_grads(model), want_params, strict=True):
        torch.testing.assert_close(got, w, rtol=TOLERANCE, atol=TOLERANCE)


def test_the_leaf_gradient_of_rows_and_bags_is_autograds() -> None:
    table = EntityTable(torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(12)))
    bags = FeatureBags(torch.tensor([0, 2, 2, 5]), torch.tensor([1, 4, 4, 0, 2]))  # the middle bag is empty
    groups = [torch.tensor([3, 1]), bags, torch.tensor([5, 3, 3])]
    gathered, rows = gather_rows(table, groups, max_norm=None, requires_grad=True)
    grads = [torch.randn(r.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(13 + i))
             for i, r in enumerate(rows)]
    torch.autograd.backward(rows, grads)
    want = gathered.leaf.grad.clone()
    gathered.set_grad([grads[0], grads[1], None])
    torch.testing.assert_close(gathered.leaf.grad[:7], want[:7], rtol=TOLERANCE, atol=TOLERANCE)
    assert torch.equal(gathered.leaf.grad[7:], torch.zeros(3, 3, dtype=torch.float64))  # no gradient: zeros


@pytest.mark.parametrize(("operator", "comparator", "global_emb", "dynamic"),
                         [("translation", "cos", True, False), ("linear", "l2", False, True),
                          ("complex_diagonal", "dot", False, True), ("affine", "squared_l2", True, False)])
def test_training_gradients_are_autograds_through_forward_batch(operator: str, comparator: str, global_emb: bool,
                                                                dynamic: bool) -> None:
    """Loss, N3 and every gradient (rows, operators, global embeddings) of one step, against
    autograd through the reference forward, with a short batch padded (static shapes)."""
    negs = NegativeSampling(3, 4)
    spec = ModelSpec({"e": 6}, (RelationSpec("r", "e", "e", operator=operator, weight=0.5),),
                     num_dynamic_rels=3 if dynamic else None, comparator=comparator, loss_fn="softmax",
                     regularization_coef=0.01, global_emb=global_emb, train_negatives=negs)
    model = _randomize(EmbeddingModel(spec), 14)
    assert isinstance(model, EmbeddingModel)
    weights = torch.randn(12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(15))
    gen = torch.Generator().manual_seed(16)
    rel: int | Tensor = torch.randint(3, (5,), generator=gen) if dynamic else 0
    batch = EdgeBatch(torch.randint(12, (5,), generator=gen), torch.randint(12, (5,), generator=gen), rel).pad(7)

    ref_table = EntityTable(weights.clone())
    ref = forward_batch(model, ref_table, ref_table, batch, negs, generator=torch.Generator().manual_seed(17))
    want_loss = batch_loss(model, ref.scores, batch)
    assert ref.reg is not None
    (want_loss + ref.reg).backward()
    want_leaf, want_params = ref.gathered[0].leaf.grad, _grads(model)
    model.zero_grad(set_to_none=True)

    table = EntityTable(weights.clone())
    step = training_gradients(model, table, table, batch, negs, generator=torch.Generator().manual_seed(17))
    torch.testing.assert_close(step.loss, want_loss.detach(), rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(step.reg, ref.reg.detach(), rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(step.gathered[0].leaf.grad, want_leaf, rtol=TOLERANCE, atol=TOLERANCE)
    for got, want in zip(_grads(model), want_params, strict=True):
        torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)


def _relation_prediction_reference(model: EmbeddingModel, rel: Tensor, u: Tensor, v: Tensor, weight: Tensor,
                                   coef: float) -> Tensor:
    """The relation-prediction loss written out: each side's scores of every relation, one
    relation at a time, and torch's cross-entropy (autograd takes its gradients)."""
    g_op, h_op = model.dynamic_operators()
    cmp = model.comparator
    total = u.new_zeros(())
    for op, query, other in ((h_op, v, u), (g_op, u, v)):
        logits = torch.stack([cmp.pair(cmp.prepare(op(query, torch.full_like(rel, r))), cmp.prepare(other))
                              for r in range(op.num_relations)], dim=1)
        total = total + (torch.nn.functional.cross_entropy(logits, rel, reduction="none") * weight).sum()
    return total * coef


def _dense(gathered: GatheredRows, count: int) -> Tensor:
    """A gathered leaf's gradient summed per table row."""
    assert gathered.leaf.grad is not None
    return gathered.leaf.grad.new_zeros(count, gathered.leaf.shape[1]).index_add_(0, gathered.ids,
                                                                                  gathered.leaf.grad)


@pytest.mark.parametrize(("operator", "comparator"),
                         [("complex_diagonal", "dot"), ("diagonal", "dot"), ("translation", "dot"),
                          ("linear", "cos"), ("translation", "l2"), ("diagonal", "squared_l2")])
def test_relation_prediction_gradients_are_autograds(operator: str, comparator: str, monkeypatch: Any) -> None:
    """A step with relation prediction: its loss is the entity loss plus the reference's
    relation cross-entropy (weighted edges, a padded batch), and every gradient (table rows,
    operators of both sides) is autograd's through the reference forward and the written-out
    relation loss. With the dot comparator the diagonal, complex-diagonal and translation
    operators take the bilinear way, the others the expanded one, in chunks of two edges."""
    import pbgtrain.model.relation_prediction as rp

    monkeypatch.setattr(rp, "CHUNK_ELEMENTS", 2 * 4 * 6)
    negs = NegativeSampling(3, 4)
    spec = ModelSpec({"e": 6}, (RelationSpec("r", "e", "e", operator=operator),), num_dynamic_rels=4,
                     comparator=comparator, loss_fn="softmax", regularization_coef=0.01, global_emb=False,
                     train_negatives=negs, relation_prediction=0.3)
    model = _randomize(EmbeddingModel(spec), 20)
    assert isinstance(model, EmbeddingModel)
    weights = torch.randn(12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(21))
    gen = torch.Generator().manual_seed(22)
    edge_weight = torch.rand(5, generator=gen, dtype=torch.float64) + 0.5
    batch = EdgeBatch(torch.randint(12, (5,), generator=gen), torch.randint(12, (5,), generator=gen),
                      torch.randint(4, (5,), generator=gen), edge_weight).pad(7)

    ref_table = EntityTable(weights.clone())
    ref = forward_batch(model, ref_table, ref_table, batch, negs, generator=torch.Generator().manual_seed(23))
    leaf = weights.clone().requires_grad_(True)
    real = int(batch.count)
    assert isinstance(batch.rel, Tensor)
    predicted = _relation_prediction_reference(model, batch.rel[:real], leaf[batch.lhs[:real]],
                                               leaf[batch.rhs[:real]], edge_weight, 0.3)
    want_loss = batch_loss(model, ref.scores, batch) + predicted
    assert ref.reg is not None
    (want_loss + ref.reg).backward()
    assert leaf.grad is not None
    want_rows, want_params = _dense(ref.gathered[0], 12) + leaf.grad, _grads(model)
    model.zero_grad(set_to_none=True)

    table = EntityTable(weights.clone())
    step = training_gradients(model, table, table, batch, negs, generator=torch.Generator().manual_seed(23))
    torch.testing.assert_close(step.loss, want_loss.detach(), rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(_dense(step.gathered[0], 12), want_rows, rtol=TOLERANCE, atol=TOLERANCE)
    for got, want in zip(_grads(model), want_params, strict=True):
        torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("operator", ["complex_diagonal", "diagonal", "translation"])
def test_relation_prediction_bilinear_way_equals_the_expanded_one(operator: str) -> None:
    """The two ways to every relation's scores give the same loss and gradients."""
    import pbgtrain.model.relation_prediction as rp

    spec = ModelSpec({"e": 6}, (RelationSpec("r", "e", "e", operator=operator),), num_dynamic_rels=5,
                     comparator="dot", global_emb=False, relation_prediction=0.7)
    model = _randomize(EmbeddingModel(spec), 30)
    assert isinstance(model, EmbeddingModel)
    g_op, _ = model.dynamic_operators()
    gen = torch.Generator().manual_seed(31)
    u, v = (torch.randn(8, 6, generator=gen, dtype=torch.float64) for _ in range(2))
    rel, scale = torch.randint(5, (8,), generator=gen), torch.rand(8, generator=gen, dtype=torch.float64)
    ways = [lambda: rp._bilinear_term(rp.BILINEAR[type(g_op)], g_op, rel, u, v, scale),
            lambda: rp._expanded_term(model.comparator, g_op, rel, u, v, scale)]
    results = []
    for way in ways:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            results.append([*way(), *_grads(model)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)
