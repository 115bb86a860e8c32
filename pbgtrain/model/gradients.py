"""A training step's gradients by hand: from the scores back to the rows and the relation parameters.

:func:`training_gradients` scores a batch as :func:`~pbgtrain.model.scoring.forward_batch` does
and takes its loss's gradient without autograd: the loss's gradient in the scores and the
comparator's adjoints (:func:`~pbgtrain.model.negative_scores.training_head`), then each side's
chain backwards (:mod:`pbgtrain.model.chains`: the comparator's ``prepare``, the operator, the
global embedding) to the looked-up rows, N3's gradient (:func:`regularization_and_grads`) on
the positives' rows, and the leaves' gradients assembled per table
(:meth:`~pbgtrain.model.lookup.GatheredRows.set_grad`). The relation parameters' gradients go
to their ``.grad``, where the relation optimizer reads them. Nothing is recorded for autograd:
a step dispatches the operations of its arithmetic only, which is what a small graph's step is
made of (tests compare every gradient with autograd's through ``forward_batch``).

>>> from pbgtrain.model.model import ModelSpec, RelationSpec, EmbeddingModel
>>> from pbgtrain.model.model import NegativeSampling
>>> spec = ModelSpec({"e": 4}, (RelationSpec("r", "e", "e", operator="diagonal"),), comparator="dot",
...                  loss_fn="softmax", lr=0.1, relation_lr=0.1, train_negatives=NegativeSampling(2, 0))
>>> model = EmbeddingModel(spec)
>>> table = EntityTable.random(10, 4, generator=torch.Generator().manual_seed(0))
>>> step = training_gradients(model, table, table, EdgeBatch(torch.tensor([0, 1]), torch.tensor([2, 3]), 0),
...                           spec.train_negatives)
>>> step.gathered[0].leaf.grad.shape, model.rhs_operators[0].diagonal.grad.shape
(torch.Size([4, 4]), torch.Size([4]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pbgtrain.model.chains import Traced
from pbgtrain.model.inputs import EdgeBatch
from pbgtrain.model.lookup import GatheredRows
from pbgtrain.model.model import EmbeddingModel, NegativeSampling
from pbgtrain.model.negative_sampling import Draws
from pbgtrain.model.negative_scores import Head, training_head
from pbgtrain.model.operators import add_grad
from pbgtrain.model.regularizers import cubed_magnitudes_and_grad
from pbgtrain.model.relation_prediction import relation_prediction_and_grads
from pbgtrain.model.scoring import Source, prepare_batch
from pbgtrain.model.tables import EntityTable


@dataclass
class TrainingStep:
    """A training step's sums, its gradients set: the loss (relation weight applied), N3 (None
    when disabled), the violators [lhs, rhs] and the edges they were counted on, and the rows to
    update, each ``leaf.grad`` set (the relation parameters' gradients are in their ``.grad``)."""

    loss: Tensor
    reg: Tensor | None
    violators: Tensor
    violators_counted_on: Tensor | int
    gathered: list[GatheredRows]


def _accumulate(grads: dict[Any, Tensor], key: Any, grad: Tensor) -> None:
    grads[key] = grad if key not in grads else grads[key] + grad


@torch.no_grad()
def training_gradients(model: EmbeddingModel, lhs_table: EntityTable, rhs_table: EntityTable, batch: EdgeBatch,
                       negatives: NegativeSampling, *, generator: Draws = None,
                       head: Head = training_head) -> TrainingStep:
    """The loss of ``batch`` as :func:`forward_batch` and the loss function give it, and its
    gradients, by hand: the scores' (``head``: :func:`~pbgtrain.model.negative_scores.training_head`,
    or the attention form of the softmax loss), then back through each side's chain
    (:mod:`pbgtrain.model.chains`) to the looked-up rows and the relation parameters, plus N3's
    (:func:`regularization_and_grads`). Nothing is recorded for autograd; a test compares the
    gradients with autograd's through :func:`forward_batch`."""
    prepared = prepare_batch(model, lhs_table, rhs_table, batch, negatives, generator, False, updates=True)
    scale = model.relation(batch.rel).weight
    traced: dict[int, Traced] = {}
    traced_grads: dict[int, Tensor] = {}

    def add(t: Traced, grad: Tensor) -> None:
        traced[id(t)] = t
        _accumulate(traced_grads, id(t), grad)

    loss: Tensor | None = None
    counts = []
    counted_on: Tensor | int = batch.count
    for g in prepared.groups:
        out = head(model.comparator, g.shape, model.loss_fn, g.tensors(g.queries), g.tensors(g.positives),
                   g.tensors(g.candidates), weight=batch.weight, own=g.own, num_real=batch.num_real)
        loss = out.loss if loss is None else loss + out.loss
        counts.append(out.violators)
        counted_on = out.violators_counted_on if len(counts) == 1 else counted_on
        for i, (query, positives) in enumerate(zip(g.queries, g.positives, strict=True)):
            add(query, out.d_queries[i])
            add(positives, out.d_positives[i])
        if out.d_candidates is not None:
            for i, candidates in enumerate(g.candidates):
                add(candidates, out.d_candidates[i])
    assert loss is not None
    row_grads: dict[Source, Tensor] = {}
    for key, grad in traced_grads.items():
        _accumulate(row_grads, prepared.sources[key], traced[key].backward(grad * scale if scale != 1.0 else grad))
    loss = loss * scale if scale != 1.0 else loss

    def add_to_positives(grads: list[Tensor]) -> None:
        """Gradients of the positives' lhs and rhs rows onto their rows."""
        for source, grad in zip(prepared.raw, grads, strict=True):
            _accumulate(row_grads, source, grad)

    reg = None
    u_raw, v_raw = prepared.raw_rows
    if model.regularizer.enabled:
        reg, *reg_grads = regularization_and_grads(model, batch.rel, u_raw, v_raw, prepared.live)
        add_to_positives(reg_grads)
    if model.spec.relation_prediction:
        assert isinstance(batch.rel, Tensor)  # dynamic relations (ModelSpec checks it)
        # a padding row has weight 0: no term, no gradient
        predicted, *rp_grads = relation_prediction_and_grads(model, batch.rel, u_raw, v_raw, batch.weight,
                                                             model.spec.relation_prediction)
        loss = loss + predicted
        add_to_positives(rp_grads)
    for index, gathered in enumerate(prepared.gathered):
        if gathered.representative is not None:  # not a frozen table
            gathered.set_grad([row_grads.get((index, part)) for part in range(len(gathered.sizes))])
    return TrainingStep(loss, reg, counts[0] if len(counts) == 1 else torch.cat(counts), counted_on,
                        prepared.gathered)


def regularization_and_grads(model: EmbeddingModel, rel: int | Tensor, u_raw: Tensor, v_raw: Tensor,
                             live: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`regularization` (which must be enabled) and its gradients in ``u_raw`` and
    ``v_raw``, without autograd; the operators' parameters' gradients are added to their ``.grad``;
    ``live`` [B] (1.0 an edge, 0.0 padding) leaves the padding rows out."""
    coef = model.regularizer.coef
    if isinstance(rel, Tensor):
        g_op, h_op = model.dynamic_operators()
        complex_valued, emb_factor = h_op.complex_valued, 2.0
        magnitudes = [*h_op.magnitudes(), *g_op.magnitudes()]
        # each parameter row counted once per edge of its relation (no bincount: a fixed length)
        ones = u_raw.new_ones(len(rel)) if live is None else live.to(u_raw.dtype)
        edges: Tensor | None = u_raw.new_zeros(h_op.num_relations).index_add_(0, rel, ones) if magnitudes else None
    else:
        static = model.static_operator(rel)
        complex_valued, emb_factor = static.complex_valued, 1.0
        magnitudes, edges = static.magnitudes(), None  # counted once per edge of the batch
    num_edges: Tensor | float = float(len(u_raw)) if live is None else live.sum()
    op_total: Tensor | None = None
    for magnitude, params in magnitudes:
        count = num_edges if edges is None else edges.view(-1, *(1,) * (magnitude.dim() - 1))
        cubes = magnitude.square().mul_(magnitude).mul_(count).sum()
        op_total = cubes if op_total is None else op_total + cubes
        scale = magnitude.mul_(count).mul_(3 * coef)
        for param in params:
            add_grad(param, param.detach() * scale)
    u_cubes, du = cubed_magnitudes_and_grad(u_raw, complex_valued, live)
    v_cubes, dv = cubed_magnitudes_and_grad(v_raw, complex_valued, live)
    emb_total = (u_cubes + v_cubes).mul_(emb_factor)
    value = (emb_total if op_total is None else emb_total + op_total).mul_(coef)
    return value, du.mul_(coef * emb_factor), dv.mul_(coef * emb_factor)
