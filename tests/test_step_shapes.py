"""A training step has no operation whose output shape depends on the data, and no read of a value.

Such an operation (``torch.unique``, ``nonzero``, a boolean mask, ``.item()``) makes a GPU's host
wait for the device every batch, and a step that has one cannot be captured and replayed. On the
meta device tensors have shapes and no values, so a step that runs there has none. Both heads
run there, eagerly and as the replay driver runs them: learning rates, the count of real edges and
the negatives' generator all held in device tensors.
"""

from __future__ import annotations

import pytest
import torch

from pbgtrain.model import (
    EdgeBatch,
    EmbeddingModel,
    EntityTable,
    ModelSpec,
    NegativeSampling,
    RelationSpec,
    make_relation_optimizer,
)
from pbgtrain.model.attention import AttentionHead, ExplicitAttention, FusedAttention
from pbgtrain.model.counter_rng import CounterGenerator
from pbgtrain.model.negative_scores import Head, training_head
from pbgtrain.model.step import StepTotals, add_train_step, step_body

pytestmark = pytest.mark.step_numerics  # CI runs these again under other CPU kernels (.ci/run)

META = torch.device("meta")
CASES = {  # name: (operator, dynamic, comparator, batch negs, uniform negs, all_negs, reg)
    "livejournal": ("none", False, "dot", 100, 100, False, 0.0),
    "static-operators": ("translation", False, "cos", 50, 50, False, 0.0),
    "one-vs-all": ("complex_diagonal", False, "dot", 0, 0, True, 0.0),
    "per-chunk-l2": ("diagonal", False, "l2", 10, 20, False, 0.0),
    "kinship": ("complex_diagonal", True, "dot", 0, 0, True, 0.005),
    "uniform-only": ("affine", False, "dot", 0, 30, False, 0.01),
    "wide-shared-uniform": ("diagonal", True, "cos", 10, 300, False, 0.0),
}
HEADS: dict[str, Head] = {"scores": training_head, "attention-fused": AttentionHead(FusedAttention()),
                          "attention-explicit": AttentionHead(ExplicitAttention())}


def _model(case: str) -> EmbeddingModel:
    operator, dynamic, comparator, batch_negs, uniform_negs, all_negs, reg = CASES[case]
    negs = NegativeSampling(batch_negs, uniform_negs, share_uniform_negs=case != "per-chunk-l2")
    spec = ModelSpec({"e": 8}, (RelationSpec("r", "e", "e", operator=operator, all_negs=all_negs),),
                     num_dynamic_rels=4 if dynamic else None, comparator=comparator, loss_fn="softmax",
                     regularization_coef=reg, global_emb=not dynamic, lr=0.1, relation_lr=0.1, train_negatives=negs,
                     eval_negatives=negs)
    return EmbeddingModel(spec).to(META)


def _batch(dynamic: bool) -> EdgeBatch:
    ids = torch.empty(100, dtype=torch.long, device=META)
    return EdgeBatch(ids, ids, torch.empty(100, dtype=torch.long, device=META) if dynamic else 0).pad(128)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_training_step_runs_on_shapes_alone(case: str) -> None:
    model = _model(case)
    table = EntityTable(torch.empty(1000, 8, device=META), torch.empty(1000, device=META))
    totals = StepTotals()
    add_train_step(totals, model, table, table, _batch(model.dynamic), make_relation_optimizer(model))
    assert totals.steps == 1


@pytest.mark.parametrize("head", sorted(HEADS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_replayed_body_runs_on_shapes_alone(case: str, head: str) -> None:
    """What a CUDA graph captures: the body with device learning rates, a device count of real
    edges and the counter generator, for each head that takes the case."""
    model = _model(case)
    if head != "scores" and not model.comparator.all_pairs_is_dot:
        pytest.skip("the attention form scores by a dot product")
    table = EntityTable(torch.empty(1000, 8, device=META), torch.empty(1000, device=META))
    generator = CounterGenerator(META)
    rate = torch.empty((), device=META)
    totals = StepTotals()
    step_body(totals, model, table, table, _batch(model.dynamic), make_relation_optimizer(model),
              generator=generator, negatives=model.spec.train_negatives, head=HEADS[head], row_lr=rate,
              relation_lr=rate)
    assert totals.steps == 0  # the body adds on the device only: counting steps is the driver's (on the host)
