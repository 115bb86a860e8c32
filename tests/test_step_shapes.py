"""A training step has no operation whose output shape depends on the data.

Such an operation (``torch.unique``, ``nonzero``, a boolean mask) makes a GPU's host wait for
the device every batch, and a step that has one cannot be captured and replayed. On the meta
device tensors have shapes and no values, so a step that runs there has none.
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
from pbgtrain.model.step import StepTotals, add_train_step

META = torch.device("meta")
CASES = {  # name: (operator, dynamic, comparator, batch negs, uniform negs, all_negs, reg)
    "livejournal": ("none", False, "dot", 100, 100, False, 0.0),
    "static-operators": ("translation", False, "cos", 50, 50, False, 0.0),
    "one-vs-all": ("complex_diagonal", False, "dot", 0, 0, True, 0.0),
    "per-chunk-l2": ("diagonal", False, "l2", 10, 20, False, 0.0),
    "kinship": ("complex_diagonal", True, "dot", 0, 0, True, 0.005),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_training_step_runs_on_shapes_alone(case: str) -> None:
    operator, dynamic, comparator, batch_negs, uniform_negs, all_negs, reg = CASES[case]
    negs = NegativeSampling(batch_negs, uniform_negs, share_uniform_negs=case != "per-chunk-l2")
    spec = ModelSpec({"e": 8}, (RelationSpec("r", "e", "e", operator=operator, all_negs=all_negs),),
                     num_dynamic_rels=4 if dynamic else None, comparator=comparator, loss_fn="softmax",
                     regularization_coef=reg, global_emb=not dynamic, lr=0.1, relation_lr=0.1, train_negatives=negs,
                     eval_negatives=negs)
    model = EmbeddingModel(spec).to(META)
    table = EntityTable(torch.empty(1000, 8, device=META), torch.empty(1000, device=META))
    ids = torch.empty(100, dtype=torch.long, device=META)
    batch = EdgeBatch(ids, ids, torch.empty(100, dtype=torch.long, device=META) if dynamic else 0).pad(128)
    totals = StepTotals()
    add_train_step(totals, model, table, table, batch, make_relation_optimizer(model))
    assert totals.steps == 1 and totals.count == 100
