"""What the replay driver (``pbgtrain.model.runner.ReplayRunner``) decides, on a CPU.

The driver is the same on a GPU and here; only its :class:`~pbgtrain.model.replayers.Replayer`
differs. The replayers below are the CPU's stand-in (the step's body in place of its capture)
counting what they are asked, or doing what a GPU's capture does when it fails: raise (nothing
ran), or record nothing while the step's operations run elsewhere (an empty graph). So these
tests count warm-up steps and captures over buckets of partitions, follow a failure, and free a
swapped-out table; the last one runs ``fit --capture`` through a partitioned run with read-ahead.
What only a GPU can show (the capture mode, the stream and device, memory) is
``tests/test_gpu_step.py``'s.
"""

from __future__ import annotations

import copy
import gc
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from pbgtrain.model import BucketEdges, EmbeddingModel, EntityTable, ModelSpec, NegativeSampling, RelationSpec
from pbgtrain.model.model import make_relation_optimizer
from pbgtrain.model.replayers import Body, CaptureSettings, CudaGraphReplayer, EmptyGraphError, StandInReplayer
from pbgtrain.model.runner import PAIR_WARMUP_STEPS, ReplayRunner, make_head, make_runner
from pbgtrain.model.step_choice import StepChoice

pytestmark = pytest.mark.step_numerics  # CI runs these again under other CPU kernels (.ci/run)

DEVICE = torch.device("cpu")


def _setup(entities: int = 40) -> tuple[EmbeddingModel, EntityTable, BucketEdges]:
    """Two static relations (the global embeddings shared), 200 edges over ``entities`` entities."""
    negs = NegativeSampling(6, 4)
    relations = (RelationSpec("r0", "e", "e", operator="translation"),
                 RelationSpec("r1", "e", "e", operator="diagonal", weight=0.5))
    spec = ModelSpec({"e": 8}, relations, comparator="dot", loss_fn="softmax", regularization_coef=0.01,
                     global_emb=True, lr=0.2, relation_lr=0.1, train_negatives=negs, eval_negatives=negs)
    model = EmbeddingModel(spec)
    model.draw_operators(0.3, 0)
    gen = torch.Generator().manual_seed(0)
    table = EntityTable(torch.randn(entities, 8, generator=gen) * 0.3)
    n = 200
    edges = BucketEdges(torch.randint(entities, (n,), generator=gen), torch.randint(entities, (n,), generator=gen),
                        torch.randint(2, (n,), generator=gen), torch.rand(n, generator=gen) + 0.5, None, None)
    return model, table, edges


class CountingReplayer(StandInReplayer):
    """The stand-in, counting its eager steps and captures; ``warmup_steps`` as asked (a GPU's: 3)."""

    def __init__(self, warmup_steps: int = 3) -> None:
        self.warmup_steps = warmup_steps
        self.eager_steps = 0
        self.captures = 0

    def eager(self, body: Body) -> None:
        self.eager_steps += 1
        body()

    def capture(self, body: Body) -> Body:
        self.captures += 1
        return body


class FailingReplayer(CountingReplayer):
    """Captures numbered in ``failing`` (from 1) fail as a GPU's does: the operation that cannot be
    captured raises, then torch's ``capture_end`` raises its own error while that one is handled."""

    def __init__(self, failing: set[int], warmup_steps: int = 3) -> None:
        super().__init__(warmup_steps)
        self.failing = failing

    def capture(self, body: Body) -> Body:
        replay = super().capture(body)
        if self.captures in self.failing:
            try:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing\n"
                                   "CUDA kernel errors might be asynchronously reported at some other API call")
            finally:
                raise RuntimeError("operation failed due to a previous error during capture")
        return replay


class EscapingReplayer(CountingReplayer):
    """Captures whose operations run outside the graph (another device's or stream's queue): the
    body runs at once, and the graph, empty, is refused (:class:`EmptyGraphError`)."""

    def capture(self, body: Body) -> Body:
        super().capture(body)
        body()
        raise EmptyGraphError("the captured graph is empty")


def _runner(model: EmbeddingModel, replayer: StandInReplayer, **kwargs: int) -> ReplayRunner:
    runner = ReplayRunner(model, make_relation_optimizer(model), make_head(StepChoice("attention"), model, DEVICE),
                          DEVICE, 16, replayer, **kwargs)
    runner.reseed(0)
    return runner


# (relation, tables, batches): four buckets as a partitioned run trains them
def _buckets(a: EntityTable, b: EntityTable, c: EntityTable) -> list[tuple[int, EntityTable, int]]:
    return [(0, a, 5), (1, a, 2),  # bucket 1: r1 has 2 batches, fewer than the warm-up's 3
            (0, b, 5), (1, b, 2),  # bucket 2: other tables of the same shape
            (0, a, 2), (1, a, 2),  # bucket 3: the first tables again (parked in memory)
            (0, c, 2)]             # bucket 4: tables of another shape


def _run(runner: object, edges: BucketEdges, buckets: list[tuple[int, EntityTable, int]]) -> None:
    for rel, table, batches in buckets:
        for k in range(batches):
            runner.train(edges, torch.arange(16 * k, 16 * k + 12), rel, table, table)  # type: ignore[attr-defined]


def test_warm_up_once_per_relation_then_a_step_and_a_graph_per_pair_of_tables_kept() -> None:
    """A GPU's 3 warm-up steps once per relation (not per bucket), one eager step per relation and
    pair of tables, then a capture, the graph replayed again when the same tables come back: a
    relation with 2 batches a bucket is captured in the next bucket. The run trains as the eager
    step (bit for bit: nothing skipped, nothing run twice)."""
    model, a, edges = _setup()
    b, c = copy.deepcopy(a), EntityTable(torch.randn(48, 8, generator=torch.Generator().manual_seed(1)) * 0.3)
    model2, a2, edges2 = _setup()
    b2, c2 = copy.deepcopy(b), copy.deepcopy(c)
    replayer = CountingReplayer(warmup_steps=3)
    runner = _runner(model, replayer)
    _run(runner, edges, _buckets(a, b, c))
    # bucket 1: r0 3 eager steps and a capture, r1 2 eager steps; bucket 2: r0 1 eager step and a
    # capture, r1 its 3rd eager step and a capture; bucket 3: r0 replays its graph, r1 (2 eager
    # steps on these tables in bucket 1) is captured; bucket 4: r0 1 eager step and a capture
    assert PAIR_WARMUP_STEPS == 1
    assert (replayer.eager_steps, replayer.captures) == (3 + 2 + 1 + 1 + 1, 1 + 2 + 1 + 1)
    assert runner.totals.steps == 20 and runner.captured == 5

    eager = make_runner(StepChoice("attention"), model2, make_relation_optimizer(model2), DEVICE, 16,
                        static_shapes=True)
    eager.reseed(0)
    _run(eager, edges2, _buckets(a2, b2, c2))
    for x, y in ((a, a2), (b, b2), (c, c2)):
        assert torch.equal(x.weights, y.weights) and torch.equal(x.adagrad_sum, y.adagrad_sum)
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)


def test_pairs_past_max_graphs_are_forgotten_the_least_recently_trained_first() -> None:
    model, a, edges = _setup()
    b, c = copy.deepcopy(a), copy.deepcopy(a)
    replayer = CountingReplayer(warmup_steps=1)
    runner = _runner(model, replayer, max_graphs=2)
    _run(runner, edges, [(0, a, 2), (0, b, 2), (0, a, 1), (0, c, 2)])  # c drops b's graph, not a's (trained since)
    assert (replayer.eager_steps, replayer.captures, runner.captured) == (3, 3, 2)
    _run(runner, edges, [(0, a, 1)])
    assert (replayer.eager_steps, replayer.captures) == (3, 3)
    _run(runner, edges, [(0, b, 1)])
    assert (replayer.eager_steps, replayer.captures) == (4, 3)


def test_a_failed_capture_uncaptures_its_relation_only_and_says_its_root_cause_once() -> None:
    """The first capture (r0's) fails: r0 trains eagerly from then on, r1 is still captured, every
    batch is trained once (as the stand-in's run, bit for bit), and the note gives the chain to
    its root cause; a second relation failing the same way adds no note."""
    model, a, edges = _setup()
    replayer = FailingReplayer({1})
    runner = _runner(model, replayer)
    _run(runner, edges, [(0, a, 5), (1, a, 5), (0, a, 3)])
    assert replayer.captures == 2  # r0's (failed) and r1's; r0 is not tried again
    assert replayer.eager_steps == 3 + 2 + 3 + 3  # r0: warm-up, the failed capture's step, 3 more; r1: warm-up
    assert runner.notes == [
        "the step of relation 'r0' (and of any other relation whose capture fails the same way) could not be "
        "captured as a CUDA graph: RuntimeError: operation failed due to a previous error during capture ← caused by "
        "RuntimeError: CUDA error: operation not permitted when stream is capturing / CUDA kernel errors might be "
        "asynchronously reported at some other API call; it trains uncaptured from now on"]

    model2, a2, edges2 = _setup()
    standing_in = _runner(model2, CountingReplayer())
    _run(standing_in, edges2, [(0, a2, 5), (1, a2, 5), (0, a2, 3)])
    assert torch.equal(a.weights, a2.weights) and torch.equal(a.adagrad_sum, a2.adagrad_sum)
    assert runner.totals.take() == standing_in.totals.take()

    model3, a3, edges3 = _setup()
    both = _runner(model3, FailingReplayer({1, 2}))
    _run(both, edges3, [(0, a3, 5), (1, a3, 5)])
    assert len(both.notes) == 1


def test_an_empty_graph_is_refused_and_its_step_not_trained_twice() -> None:
    """A capture whose operations ran outside it (``--device cuda:N`` captured on another device's
    stream) records nothing: refused, the relation uncaptured, its step (done, outside the graph)
    not run again: the run trains as the stand-in's, bit for bit."""
    model, a, edges = _setup()
    replayer = EscapingReplayer()
    runner = _runner(model, replayer)
    _run(runner, edges, [(0, a, 6)])
    assert (replayer.captures, replayer.eager_steps) == (1, 3 + 2)
    assert len(runner.notes) == 1 and "EmptyGraphError: the captured graph is empty" in runner.notes[0]

    model2, a2, edges2 = _setup()
    standing_in = _runner(model2, CountingReplayer())
    _run(standing_in, edges2, [(0, a2, 6)])
    assert torch.equal(a.weights, a2.weights)
    assert runner.totals.take() == standing_in.totals.take()


def test_the_stand_in_keeps_no_swapped_out_table_alive() -> None:
    """A partition swapped out is freed once its bucket is done: neither its graph (held weakly)
    nor the stand-in's "capture" (the body, which finds its tables at each call) keeps it."""
    model, a, edges = _setup()
    runner = _runner(model, CountingReplayer(warmup_steps=1))
    swapped = copy.deepcopy(a)
    _run(runner, edges, [(0, swapped, 3), (1, swapped, 3)])
    assert runner.captured == 2
    freed = weakref.ref(swapped)
    del swapped
    gc.collect()
    assert freed() is None
    _run(runner, edges, [(0, a, 2)])  # a new pair of tables: the stale pairs are dropped, their graphs with them
    assert runner.captured == 1


def test_the_gpu_captures_in_thread_local_error_mode() -> None:
    """The read-ahead thread pins host memory while a bucket's graphs are captured: only the
    capturing thread's calls may break a capture (torch's default, global, counts every thread's).
    The arguments are the ones ``CudaGraphReplayer.capture`` gives ``torch.cuda.graph``."""
    settings = CudaGraphReplayer.settings
    assert settings == CaptureSettings()
    assert settings.graph_arguments(pool=(0, 7), stream="the replayer's") == {
        "pool": (0, 7), "stream": "the replayer's", "capture_error_mode": "thread_local"}


def _arrays(directory: Path) -> dict[str, np.ndarray]:
    """Every array of the last committed checkpoint: embeddings, their Adagrad sums, the model's parameters."""
    from pbgio.checkpoint import CheckpointDir

    ckpt = CheckpointDir(directory)
    version = ckpt.read_version()
    out: dict[str, np.ndarray] = {}
    for path in ckpt.files_of_version(version):
        if path.name.startswith("embeddings_"):
            etype, part = path.name[len("embeddings_"):].split(".")[0].rsplit("_", 1)
            state = ckpt.read_embeddings(etype, int(part), version)
            out[path.name] = state.embeddings
            out[path.name + ":optimizer"] = np.asarray(state.optimizer_state)
        else:
            out.update({f"model:{k}": v for k, v in ckpt.read_model(version).params.items()})
    return out


def test_fit_with_capture_runs_the_replay_driver_through_a_partitioned_fit(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``fit --step attention --capture`` on a CPU (the stand-in) over the example's 2×2 buckets,
    partitions read ahead, two epochs: every checkpoint array equals the eager step's with the same
    padding (``--static-shapes``) bit for bit, with partitions parked in memory (graphs replayed
    again) or saved at each swap (captured again); no capture note."""
    from pbgio.example import build_example
    from pbgtrain.config import load_run_config
    from pbgtrain.train import FitOptions, fit

    for gib in (0.0, 1.0):
        files = {}
        for capture in (False, True):
            config = build_example(tmp_path / f"{gib}-{capture}", num_edges=2000)
            options = FitOptions(seed=3, step="attention", capture=capture, static_shapes=not capture,
                                 read_ahead_partitions=True, partition_memory=gib)
            result = fit(load_run_config(config, ["num_epochs=2"]), options)
            assert result.movement[0]["partitions_read_ahead"] > 0 or gib > 0
            files[capture] = _arrays(config.parent / "checkpoint")
        assert files[False].keys() == files[True].keys()
        for name, value in files[False].items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, files[True][name], err_msg=name)
    assert "could not be captured" not in capsys.readouterr().err
