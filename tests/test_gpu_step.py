"""The GPU's step: the softmax over negatives as fused attention, captured and replayed as a CUDA graph.

Skipped without CUDA (``pytest -m gpu`` on a machine with one). What the default suite shows on a
CPU (``tests/test_attention_step.py``, ``tests/test_step_runner.py``, ``tests/test_step_shapes.py``)
holds here on the device: the captured step trains as the eager one, the fused kernels as the
score matrices within bf16's rounding, the step's body never waits for the device, and a
featurized run takes the score-matrix step and says why.
"""

from __future__ import annotations

import copy

import pytest
import torch

from pbgtrain.model import (
    BucketEdges,
    EdgeBatch,
    EmbeddingModel,
    EntityTable,
    ModelSpec,
    NegativeSampling,
    RelationSpec,
)
from pbgtrain.model.attention import AttentionHead, FusedAttention
from pbgtrain.model.counter_rng import CounterGenerator
from pbgtrain.model.gradients import training_gradients
from pbgtrain.model.model import make_relation_optimizer
from pbgtrain.model.negative_scores import training_head
from pbgtrain.model.precision import precision_scope
from pbgtrain.model.runner import ReplayRunner, make_runner
from pbgtrain.model.step import StepTotals, step_body
from pbgtrain.model.step_choice import StepChoice

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")

SHAPES = {  # name: (operator, dynamic, all_negs, batch negs, uniform negs, N3)
    "livejournal": ("none", False, False, 256, 256, 0.0),
    "freebase": ("complex_diagonal", True, False, 128, 128, 0.0),
    "one-vs-all": ("complex_diagonal", True, True, 0, 0, 1e-3),
    "static-global": ("translation", False, False, 64, 500, 1e-3),
}


def _model(shape: str, dimension: int = 64) -> tuple[EmbeddingModel, EntityTable, BucketEdges]:
    operator, dynamic, all_negs, batch_negs, uniform_negs, reg = SHAPES[shape]
    negs = NegativeSampling(batch_negs, uniform_negs)
    spec = ModelSpec({"e": dimension}, (RelationSpec("r", "e", "e", operator=operator, all_negs=all_negs),),
                     num_dynamic_rels=20 if dynamic else None, comparator="dot", loss_fn="softmax",
                     regularization_coef=reg, global_emb=not dynamic, lr=0.1, relation_lr=0.1, train_negatives=negs,
                     eval_negatives=negs)
    model = EmbeddingModel(spec)
    model.draw_operators(0.1, 0)
    gen = torch.Generator().manual_seed(0)
    entities = 3000 if all_negs else 50_000
    table = EntityTable((torch.randn(entities, dimension, generator=gen) * 0.1).to(CUDA))
    n = 40_000
    edges = BucketEdges(torch.randint(entities, (n,), generator=gen).to(CUDA),
                        torch.randint(entities, (n,), generator=gen).to(CUDA),
                        torch.randint(20 if dynamic else 1, (n,), generator=gen).to(CUDA), None, None, None)
    return model.to(CUDA), table, edges


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_captured_step_trains_as_the_eager_one_after_many_steps(shape: str) -> None:
    """80 batches of 1,000 (the last of each 20 shorter: padding as data), fp32: the replayed run and
    the eager one draw the same negatives (one counter generator) and end with the same tables."""
    model, table, edges = _model(shape)
    dynamic = model.dynamic
    results = []
    for capture in ("none", "cuda-graph"):
        m, t = copy.deepcopy(model), copy.deepcopy(table)
        optimizer = make_relation_optimizer(m)
        runner = make_runner(StepChoice("attention", capture=capture), m, optimizer, CUDA, 1000)  # type: ignore[arg-type]
        for i in range(80):
            if i % 20 == 0:
                runner.reseed(i)
            size = 1000 if i % 20 != 19 else 377
            idx = torch.arange(i * 1000, i * 1000 + size, device=CUDA) % len(edges)
            runner.train(edges, idx, None if dynamic else 0, t, t)
        stats = runner.totals.take()
        if capture == "cuda-graph":
            assert isinstance(runner, ReplayRunner) and not runner.notes, runner.notes
            assert all(graph.replay is not None for graph in runner._graphs.values())
        results.append((t, m, stats))
    (eager_table, eager_model, eager_stats), (replayed_table, replayed_model, replayed_stats) = results
    torch.testing.assert_close(replayed_table.weights, eager_table.weights, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(replayed_table.adagrad_sum, eager_table.adagrad_sum, rtol=1e-3, atol=1e-5)
    for p, q in zip(replayed_model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)
    assert replayed_stats.count == eager_stats.count == 80 * 1000 - 4 * 623
    assert replayed_stats.loss == pytest.approx(eager_stats.loss, rel=1e-3)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_fused_kernels_agree_with_the_score_matrices_within_bf16(shape: str) -> None:
    """One step's loss and row gradients, bf16 products: the fused attention head against the
    score-matrix head (both rounded to bf16; relative error of the gradients under 3%)."""
    model, table, edges = _model(shape, dimension=100)
    idx = torch.arange(2000, device=CUDA)
    batch = edges.batch(idx, edges.rel[idx] if model.dynamic else 0)
    outs = []
    for head in (training_head, AttentionHead(FusedAttention())):
        t = copy.deepcopy(table)
        with precision_scope("bf16", CUDA):
            step = training_gradients(model, t, t, batch, model.spec.train_negatives,
                                      generator=torch.Generator(CUDA).manual_seed(1), head=head)
        grad = torch.zeros_like(t.weights).index_add_(0, step.gathered[0].ids, step.gathered[0].leaf.grad)
        outs.append((step.loss, grad))
        model.zero_grad(set_to_none=True)
    (loss_a, grad_a), (loss_b, grad_b) = outs
    assert float(loss_b) == pytest.approx(float(loss_a), rel=2e-2)
    assert float((grad_b - grad_a).norm() / grad_a.norm()) < 0.03


@pytest.mark.parametrize("head", ["scores", "attention"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_step_body_never_synchronises(shape: str, head: str) -> None:
    """``torch.cuda.set_sync_debug_mode("error")`` raises on any host synchronisation: none in the
    step's body (after one warm-up step, which makes the lazy allocations)."""
    model, table, edges = _model(shape)
    optimizer = make_relation_optimizer(model)
    heads = {"scores": training_head, "attention": AttentionHead(FusedAttention())}
    count = torch.tensor(900, device=CUDA)
    idx = torch.arange(1000, device=CUDA)
    batch = EdgeBatch(edges.lhs[idx], edges.rhs[idx], edges.rel[idx] if model.dynamic else 0,
                      torch.ones(1000, device=CUDA), num_real=count)
    generator = CounterGenerator(CUDA)
    generator.manual_seed(3)
    rate = torch.tensor(0.1, device=CUDA)
    totals = StepTotals()

    def body() -> None:
        step_body(totals, model, table, table, batch, optimizer, generator=generator,
                  negatives=model.spec.train_negatives, head=heads[head], row_lr=rate, relation_lr=rate)

    body()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with precision_scope("bf16", CUDA):
            body()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert totals.result().count == 2 * 900


def test_a_featurized_run_on_a_gpu_takes_the_score_matrices_and_says_why() -> None:
    """Featurized entities (feature bags of changing lengths) keep today's step, uncaptured; the
    featurized sample's training on the GPU is ``test_train_featurized.py``'s."""
    from types import SimpleNamespace

    from pbgtrain.training.fit_plan import resolve_step

    cfg = SimpleNamespace(loss_fn="softmax", comparator="dot", bias=False, max_norm=None, dynamic_relations=False,
                          relations=[SimpleNamespace(operator="none", all_negs=False)], num_machines=1,
                          featurized_types=lambda: ["doc"], batch_size=1000, num_batch_negs=50, num_uniform_negs=50)
    choice = resolve_step("auto", None, False, cfg, CUDA)
    assert (choice.head, choice.capture) == ("scores", "none")
    assert "featurized entity types (doc)" in choice.note
