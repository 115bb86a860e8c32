"""The GPU's step: the softmax over negatives as fused attention, captured and replayed as a CUDA graph.

Skipped without CUDA (``pytest -m gpu`` on a machine with one). What the default suite shows on a
CPU (``tests/test_attention_step.py``, ``tests/test_step_runner.py``, ``tests/test_capture_driver.py``,
``tests/test_step_shapes.py``) holds here on the device: the captured step trains as the eager one
in fp32 and in bf16, two relations' graphs share one memory pool, a partitioned fit captures
while partitions are read ahead and pinned, a step on ``cuda:1`` is captured there, a failed
capture gives back the stream and leaves the next capture working, an empty graph is refused,
the memory after a capture is the pool's alone; the fused kernels agree with the score matrices
within bf16's rounding, the step's body never waits for the device, and a featurized run takes
the score-matrix step and says why.
"""

from __future__ import annotations

import copy
from pathlib import Path

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
from pbgtrain.model.replayers import CudaGraphReplayer, EmptyGraphError, failure_chain
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


def _atol(steps: int, lr: float, terms: int) -> float:
    """How far two runs of the same kernels on the same shapes may end apart, per coordinate.

    They differ only by the order of float32 atomic additions (``index_add_`` of rows repeated in
    a batch, the fused backward's sums over keys): a sum of ``terms`` terms in two orders differs by
    at most 2·(terms − 1)·u·Σ|terms| (u = 2⁻²⁴), a relative difference of the gradient below
    ε = 2·terms·u where it does not cancel. Adagrad moves a coordinate by lr·g/√(Σg²) ≤ lr a
    step, so ε moves it by at most 2·lr·ε (the ratio and the sum both perturbed); over ``steps``
    steps that is ``steps``·2·lr·ε, a linear bound (each step's difference added, not compounded:
    the runs' scores stay within the same ε)."""
    return steps * 2 * lr * 2 * terms * 2.0 ** -24


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_captured_step_trains_as_the_eager_one_after_many_steps(shape: str, precision: str) -> None:
    """80 batches of 1,000 (the last of each 20 shorter: padding as data), fp32 and bf16 products
    (every target is in bf16, inside the graph too): the replayed run and the eager one padded
    alike (the same kernels on the same shapes) draw the same negatives (one counter generator)
    and end with the same tables, within the order of atomic additions (:func:`_atol`)."""
    model, table, edges = _model(shape)
    dynamic = model.dynamic
    results = []
    for capture in ("none", "cuda-graph"):
        m, t = copy.deepcopy(model), copy.deepcopy(table)
        optimizer = make_relation_optimizer(m)
        runner = make_runner(StepChoice("attention", capture=capture), m, optimizer, CUDA, 1000,  # type: ignore[arg-type]
                             static_shapes=True)
        with precision_scope(precision, CUDA):  # type: ignore[arg-type]
            for i in range(80):
                if i % 20 == 0:
                    runner.reseed(i)
                size = 1000 if i % 20 != 19 else 377
                idx = torch.arange(i * 1000, i * 1000 + size, device=CUDA) % len(edges)
                runner.train(edges, idx, None if dynamic else 0, t, t)
        stats = runner.totals.take()
        if capture == "cuda-graph":
            assert isinstance(runner, ReplayRunner) and not runner.notes, runner.notes
            assert runner.captured == 1
        results.append((t, m, stats))
    (eager_table, eager_model, eager_stats), (replayed_table, replayed_model, replayed_stats) = results
    atol = _atol(80, 0.1, 2 * 1000)
    torch.testing.assert_close(replayed_table.weights, eager_table.weights, rtol=0, atol=atol)
    for p, q in zip(replayed_model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=atol)
    assert replayed_stats.count == eager_stats.count == 80 * 1000 - 4 * 623


def test_two_relations_share_the_pool_with_interleaved_replays() -> None:
    """Two static relations, their batches interleaved (r0, r1, r0, …): two graphs in one memory
    pool, each replayed between the other's replays (what a graph leaves in the pool, its
    gradients, is rewritten by its next replay before it is read), trained as the eager step."""
    negs = NegativeSampling(128, 128)
    relations = (RelationSpec("r0", "e", "e", operator="translation"),
                 RelationSpec("r1", "e", "e", operator="complex_diagonal", weight=0.5))
    spec = ModelSpec({"e": 64}, relations, comparator="dot", loss_fn="softmax", regularization_coef=1e-3,
                     global_emb=True, lr=0.1, relation_lr=0.1, train_negatives=negs, eval_negatives=negs)
    model = EmbeddingModel(spec)
    model.draw_operators(0.1, 0)
    model = model.to(CUDA)
    gen = torch.Generator().manual_seed(0)
    table = EntityTable((torch.randn(20_000, 64, generator=gen) * 0.1).to(CUDA))
    edges = BucketEdges(torch.randint(20_000, (40_000,), generator=gen).to(CUDA),
                        torch.randint(20_000, (40_000,), generator=gen).to(CUDA),
                        torch.zeros(40_000, dtype=torch.long, device=CUDA), None, None, None)
    results = []
    for capture in ("none", "cuda-graph"):
        m, t = copy.deepcopy(model), copy.deepcopy(table)
        runner = make_runner(StepChoice("attention", capture=capture), m, make_relation_optimizer(m), CUDA,  # type: ignore[arg-type]
                             1000, static_shapes=True)
        runner.reseed(5)
        with precision_scope("bf16", CUDA):
            for i in range(40):
                runner.train(edges, torch.arange(i * 1000, (i + 1) * 1000, device=CUDA), i % 2, t, t)
        if capture == "cuda-graph":
            assert isinstance(runner, ReplayRunner) and not runner.notes, runner.notes
            assert runner.captured == 2
        results.append((t, m, runner.totals.take()))
    (eager_table, eager_model, eager_stats), (replayed_table, replayed_model, replayed_stats) = results
    atol = _atol(40, 0.1, 2 * 1000)
    torch.testing.assert_close(replayed_table.weights, eager_table.weights, rtol=0, atol=atol)
    for p, q in zip(replayed_model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=atol)
    assert replayed_stats.count == eager_stats.count == 40_000


def test_a_partitioned_fit_with_read_ahead_captures_beside_a_pinning_thread(tmp_path: Path,
                                                                         capfd: pytest.CaptureFixture[str]) -> None:
    """``fit --capture`` on the card over the example's 2×2 buckets, partitions saved at each swap
    and read ahead into pinned memory, and a thread pinning host memory all along (the capture's
    mode is thread_local: another thread's pinning breaks nothing): no capture note, no error in
    the pinning thread, and the checkpoint as the eager step's padded alike (:func:`_atol`)."""
    import threading

    import numpy as np

    from pbgio.checkpoint import CheckpointDir
    from pbgio.example import build_example
    from pbgtrain.config import load_run_config
    from pbgtrain.train import FitOptions, fit

    stop, errors = threading.Event(), []

    def pin() -> None:
        while not stop.is_set():
            try:
                torch.empty(1 << 18).pin_memory()
            except Exception as exc:  # what the test reports
                errors.append(exc)
                return

    arrays = {}
    for capture in (False, True):
        config = build_example(tmp_path / str(capture), num_edges=20_000)
        pinning = threading.Thread(target=pin)
        pinning.start()
        try:
            result = fit(load_run_config(config, ["num_epochs=3"]),
                         FitOptions(device="cuda", seed=3, step="attention", capture=capture, static_shapes=True,
                                    read_ahead_partitions=True, partition_memory=0.0))
        finally:
            stop.set()
            pinning.join()
            stop.clear()
        assert result.movement[0]["partitions_read_ahead"] > 0
        ckpt = CheckpointDir(config.parent / "checkpoint")
        version = ckpt.read_version()
        arrays[capture] = {(etype, part): ckpt.read_embeddings(etype, part, version).embeddings
                           for etype, part in (("user", 0), ("user", 1), ("item", 0))}
    assert not errors, errors
    assert "could not be captured" not in capfd.readouterr().err
    batches = 3 * 20_000 // 100  # 3 epochs of the example's batches of 100 (fewer per table)
    atol = _atol(batches, 0.1, 2 * 100)  # 0.1: above the example's rates (lr 0.01)
    for key, value in arrays[False].items():
        np.testing.assert_allclose(arrays[True][key], value, rtol=0, atol=atol, err_msg=str(key))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_step_on_another_device_than_the_current_one_is_captured_there() -> None:
    """``--device cuda:1`` while cuda:0 is current: the graph is captured on cuda:1's stream (an
    empty graph would be refused with a note, and every replay would do nothing), and trains as
    the eager step there."""
    other = torch.device("cuda", 1)
    model, table, edges = _model("freebase")
    model, table = model.to(other), EntityTable(table.weights.to(other))
    edges = BucketEdges(edges.lhs.to(other), edges.rhs.to(other), edges.rel.to(other), None, None, None)
    results = []
    with torch.cuda.device(0):
        for capture in ("none", "cuda-graph"):
            m, t = copy.deepcopy(model), copy.deepcopy(table)
            runner = make_runner(StepChoice("attention", capture=capture), m, make_relation_optimizer(m), other,  # type: ignore[arg-type]
                                 1000, static_shapes=True)
            runner.reseed(1)
            for i in range(20):
                runner.train(edges, torch.arange(i * 1000, (i + 1) * 1000, device=other), None, t, t)
            if capture == "cuda-graph":
                assert isinstance(runner, ReplayRunner) and not runner.notes, runner.notes
                assert runner.captured == 1
            assert torch.cuda.current_device() == 0
            results.append(t.weights)
    assert not torch.equal(results[1], table.weights)  # training moved
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=_atol(20, 0.1, 2 * 1000))


def test_a_failed_capture_gives_back_the_stream_and_the_next_capture_works() -> None:
    """An operation that cannot be captured (a read to the host): the capture raises with the
    root cause in its chain, the thread's current stream is the one it had, and a later capture
    (a fresh pool) records and replays; work sent to another stream during a capture leaves the
    graph empty, which is refused, that work done once."""
    replayer = CudaGraphReplayer(CUDA)
    x = torch.ones(4, device=CUDA)
    before = torch.cuda.current_stream()
    with pytest.raises(RuntimeError) as failed:
        replayer.capture(lambda: x.sum().item())  # type: ignore[arg-type,return-value]
    assert torch.cuda.current_stream() == before
    assert any("capturing" in link for link in failure_chain(failed.value)), failure_chain(failed.value)
    replay = replayer.capture(lambda: x.add_(1))  # type: ignore[arg-type,return-value]
    replay()
    replay()
    torch.cuda.synchronize()
    assert x.tolist() == [3.0] * 4
    elsewhere = torch.cuda.Stream()  # type: ignore[no-untyped-call]

    def outside() -> None:
        with torch.cuda.stream(elsewhere):
            x.add_(1)

    with pytest.raises(EmptyGraphError):
        replayer.capture(outside)
    torch.cuda.synchronize()
    assert x.tolist() == [4.0] * 4 and torch.cuda.current_stream() == before


def test_memory_after_capture_is_the_pool_not_the_warm_ups_as_well() -> None:
    """Warm-up steps cache a step's working set on the side stream; the capture gives it back
    (torch's empty_cache on entering the capture) and the pool holds one step's. Reserved memory
    after the capture: at most one step's peak, rounded to the allocator's segments (2 MiB for
    blocks to 1 MiB, 20 MiB for blocks to 10 MiB, larger ones to 2 MiB: at most a segment of each
    kind part-used per size, 64 MiB in all), where keeping both would take twice the peak."""
    negs = NegativeSampling(1000, 1000)
    spec = ModelSpec({"e": 128}, (RelationSpec("r", "e", "e"),), comparator="dot", loss_fn="softmax", lr=0.1,
                     relation_lr=0.1, train_negatives=negs, eval_negatives=negs)
    model = EmbeddingModel(spec).to(CUDA)
    table = EntityTable.random(200_000, 128, generator=torch.Generator().manual_seed(0), device="cpu")
    table = EntityTable(table.weights.to(CUDA))
    gen = torch.Generator().manual_seed(1)
    edges = BucketEdges(torch.randint(200_000, (400_000,), generator=gen).to(CUDA),
                        torch.randint(200_000, (400_000,), generator=gen).to(CUDA),
                        torch.zeros(400_000, dtype=torch.long, device=CUDA), None, None, None)
    runner = make_runner(StepChoice("attention", capture="cuda-graph"), model, make_relation_optimizer(model), CUDA,
                         40_000)
    runner.reseed(0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base_reserved, base_allocated = torch.cuda.memory_reserved(CUDA), torch.cuda.memory_allocated(CUDA)
    torch.cuda.reset_peak_memory_stats(CUDA)
    batches = [torch.arange(i * 40_000, (i + 1) * 40_000, device=CUDA) for i in range(10)]
    for idx in batches[:3]:  # the warm-up
        runner.train(edges, idx, 0, table, table)
    torch.cuda.synchronize()
    step_peak = torch.cuda.max_memory_allocated(CUDA) - base_allocated
    for idx in batches[3:]:  # the capture, then replays
        runner.train(edges, idx, 0, table, table)
    torch.cuda.synchronize()
    assert isinstance(runner, ReplayRunner) and runner.captured == 1 and not runner.notes, runner.notes
    after = torch.cuda.memory_reserved(CUDA) - base_reserved
    assert after <= step_peak + (64 << 20), (after, step_peak)
    assert step_peak > (64 << 20)  # batches of 40,000: twice the peak breaks the bound, the test tells them apart


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
