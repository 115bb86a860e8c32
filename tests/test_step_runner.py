"""The run's step (``pbgtrain.model.runner``): eager, and through the replay driver.

On a CPU the replay driver runs everything a GPU runs (static buffers filled per batch, padding as
a device count, learning rates and the negatives' generator in device memory, graphs per relation
and pair of tables, warm-up steps, host-side step counts) except the capture call, which its
stand-in replaces by the step's body. So the tests here hold the driver to the eager step, bit for
bit: the same operations on the same shapes give the same bits on any CPU. What the driver
decides (when it captures, what a failed capture does) is ``tests/test_capture_driver.py``'s.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from pbgtrain.cli import app
from pbgtrain.model import BucketEdges, EmbeddingModel, EntityTable, ModelSpec, NegativeSampling, RelationSpec
from pbgtrain.model.model import make_relation_optimizer
from pbgtrain.model.relation_adagrad import RelationAdagrad
from pbgtrain.model.runner import ReplayRunner, make_runner
from pbgtrain.model.step_choice import StepChoice

pytestmark = pytest.mark.step_numerics  # CI runs these again under other CPU kernels (.ci/run)

DEVICE = torch.device("cpu")


def _setup(dynamic: bool, *, all_negs: bool = False, seed: int = 0, batch_negs: int = 6,
           uniform_negs: int = 4) -> tuple[EmbeddingModel, EntityTable, BucketEdges]:
    negs = NegativeSampling(batch_negs, uniform_negs)
    relations = (RelationSpec("r", "e", "e", operator="complex_diagonal", all_negs=all_negs),) if dynamic else (
        RelationSpec("r0", "e", "e", operator="translation"), RelationSpec("r1", "e", "e", operator="diagonal",
                                                                           weight=0.5))
    spec = ModelSpec({"e": 8}, relations, num_dynamic_rels=5 if dynamic else None, comparator="dot",
                     loss_fn="softmax", regularization_coef=0.01, global_emb=not dynamic, lr=0.2, relation_lr=0.1,
                     train_negatives=negs, eval_negatives=negs)
    model = EmbeddingModel(spec)
    model.draw_operators(0.3, seed)
    gen = torch.Generator().manual_seed(seed)
    table = EntityTable(torch.randn(40, 8, generator=gen) * 0.3)
    n = 200
    edges = BucketEdges(torch.randint(40, (n,), generator=gen), torch.randint(40, (n,), generator=gen),
                        torch.randint(5 if dynamic else 2, (n,), generator=gen), torch.rand(n, generator=gen) + 0.5,
                        None, None)
    return model, table, edges


def _batches(edges: BucketEdges, dynamic: bool, batch_size: int,
             seed: int = 1) -> list[tuple[torch.Tensor, int | None]]:
    """Shuffled batches of at most ``batch_size`` edges (one relation each when static), the last of each shorter."""
    order = torch.randperm(len(edges), generator=torch.Generator().manual_seed(seed))
    out: list[tuple[torch.Tensor, int | None]] = []
    groups = [(order, None)] if dynamic else [(order[edges.rel[order] == r], r) for r in (0, 1)]
    for idx, rel in groups:
        out += [(idx[i:i + batch_size], rel) for i in range(0, len(idx), batch_size)]
    return out


OptimizerOf = Callable[[EmbeddingModel], RelationAdagrad | None]


def _train(runner_of: object, model: EmbeddingModel, table: EntityTable, edges: BucketEdges, batches: list,
           *, reseed_every: int = 7, optimizer_of: OptimizerOf = make_relation_optimizer,
           ) -> tuple[EmbeddingModel, EntityTable, list, object]:
    model, table = copy.deepcopy(model), copy.deepcopy(table)
    optimizer = optimizer_of(model)
    runner = runner_of(model, optimizer)  # type: ignore[operator]
    stats = []
    for i, (idx, rel) in enumerate(batches):
        if i % reseed_every == 0:
            runner.reseed(100 + i)
            if i:
                stats.append(runner.totals.take())
        runner.train(edges, idx, rel, table, table)
    stats.append(runner.totals.take())
    return model, table, stats, optimizer


def _assert_same(a: tuple, b: tuple) -> None:
    """Bit for bit: tables, Adagrad sums, relation parameters and their optimizer state, and every
    sum of the stats (loss, regularizer, edges, violators)."""
    model_a, table_a, stats_a, opt_a = a
    model_b, table_b, stats_b, opt_b = b
    assert torch.equal(table_a.weights, table_b.weights)
    assert torch.equal(table_a.adagrad_sum, table_b.adagrad_sum)
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(p.detach(), q.detach())
        assert torch.equal(opt_a.state[p]["sum"], opt_b.state[q]["sum"])
        assert float(opt_a.state[p]["step"]) == float(opt_b.state[q]["step"])
    assert stats_a == stats_b


def _eager(*, padded: bool) -> object:
    """The eager attention step, its batches padded to the driver's 16 rows (``--static-shapes``) or not."""
    return lambda m, o: make_runner(StepChoice("attention"), m, o, DEVICE, 16, static_shapes=padded)


def _replayed(m: EmbeddingModel, o: RelationAdagrad | None) -> object:
    return make_runner(StepChoice("attention", capture="stand-in"), m, o, DEVICE, 16)


@pytest.mark.parametrize(("dynamic", "all_negs"), [(False, False), (True, False), (True, True)])
def test_the_replay_driver_trains_as_the_eager_attention_step(dynamic: bool, all_negs: bool) -> None:
    """Every batch padded to 16 rows in the driver's buffers; the same negatives (one counter
    generator reseeded alike), the same sums, tables and optimizer states, bit for bit: as the
    eager step padded alike in every case, and as the unpadded one where padding changes no sum.

    Where it does: a static relation's parameters (translation, diagonal, the global embeddings)
    take the sum of the batch's rows (``operators.rows_sum``, a ``sum`` over rows), and torch's CPU
    sum of a few rows keeps four accumulators (row i into i mod 4, the rows past the last multiple
    of four into the first): the zero rows of padding move a short batch's last rows into other
    accumulators, another rounding (the runs end an ulp apart, 3e-8). Dynamic relations add each
    row to its relation's row of the gradient in order (``index_add_``), where zero rows change nothing."""
    model, table, edges = _setup(dynamic, all_negs=all_negs)
    batches = _batches(edges, dynamic, 16)
    replayed = _train(_replayed, model, table, edges, batches)
    _assert_same(_train(_eager(padded=True), model, table, edges, batches), replayed)
    if dynamic:
        _assert_same(_train(_eager(padded=False), model, table, edges, batches), replayed)
    else:
        full = [(idx, rel) for idx, rel in batches if len(idx) == 16]
        assert len(full) < len(batches)  # each relation's last batch is short, and left out here
        _assert_same(_train(_eager(padded=False), model, table, edges, full),
                     _train(_replayed, model, table, edges, full))
    assert replayed[2][0].violators_sampled is False or replayed[2][0].violator_edges < replayed[2][0].count
    assert float(replayed[3].state[next(replayed[0].parameters())]["step"]) > 0  # the optimizer's steps were counted


def test_the_replay_driver_with_the_score_matrix_head_trains_as_the_padded_eager_step() -> None:
    model, table, edges = _setup(True)
    batches = _batches(edges, True, 16)
    eager = _train(lambda m, o: make_runner(StepChoice("scores"), m, o, DEVICE, 16, static_shapes=True,
                                            generator=None), model, table, edges, batches)
    # the eager score-matrix step draws from a torch generator: give the driver's counter stream to both
    replayed = _train(lambda m, o: make_runner(StepChoice("scores", capture="stand-in"), m, o, DEVICE, 16),
                      model, table, edges, batches)
    assert eager[2][-1].count == replayed[2][-1].count
    assert replayed[2][-1].violator_edges == replayed[2][-1].count  # the score matrices count every edge


def test_learning_rates_changed_between_steps_reach_the_replayed_step() -> None:
    """``--lr-decay`` replaces ``spec.lr`` and the optimizer's rate: the driver refills the memory
    its step reads, so the replayed run trains as the eager one."""
    model, table, edges = _setup(True)
    batches = _batches(edges, True, 16)

    def decaying(choice: StepChoice):  # type: ignore[no-untyped-def]
        def make(m: EmbeddingModel, o: object) -> object:
            runner = make_runner(choice, m, o, DEVICE, 16)  # type: ignore[arg-type]
            train = runner.train

            def train_and_decay(*args: object) -> None:
                train(*args)  # type: ignore[arg-type]
                m.spec = dataclasses.replace(m.spec, lr=m.spec.lr * 0.9)
                for group in o.param_groups:  # type: ignore[attr-defined]
                    group["lr"] *= 0.9

            runner.train = train_and_decay  # type: ignore[method-assign]
            return runner
        return make

    eager = _train(decaying(StepChoice("attention")), model, table, edges, batches)
    replayed = _train(decaying(StepChoice("attention", capture="stand-in")), model, table, edges, batches)
    _assert_same(eager, replayed)
    fixed = _train(_replayed, model, table, edges, batches)
    assert not torch.equal(fixed[1].weights, replayed[1].weights)


def _two_groups(rates: tuple[float, float]) -> OptimizerOf:
    """The relation optimizer with the operator's parameters in one group and the rest in another."""
    def make(model: EmbeddingModel) -> RelationAdagrad:
        named = list(model.named_parameters())
        first = [p for name, p in named if name.startswith("rhs_operators.0.")]
        rest = [p for name, p in named if not name.startswith("rhs_operators.0.")]
        return RelationAdagrad([{"params": first, "lr": rates[0]}, {"params": rest, "lr": rates[1]}], lr=rates[0],
                               eps=1e-10)
    return make


def test_a_relation_optimizer_with_a_rate_per_group_trains_each_group_at_its_rate_through_the_driver() -> None:
    """A loaded optimizer state may give its param groups different rates, which one rate tensor
    cannot hold: those steps run eagerly through the driver, each group at its rate (the eager
    step's result, bit for bit), and the run says so once. One rate for every group would not."""
    model, table, edges = _setup(False)
    batches = _batches(edges, False, 16)
    two_rates = _two_groups((0.1, 0.025))
    replayed = _train(_replayed, model, table, edges, batches, optimizer_of=two_rates)
    _assert_same(_train(_eager(padded=True), model, table, edges, batches, optimizer_of=two_rates), replayed)
    first_rate_for_all = _train(_eager(padded=True), model, table, edges, batches, optimizer_of=_two_groups((0.1, 0.1)))
    embedding = "global_embs.emb_e"  # in the second group
    assert not torch.equal(dict(first_rate_for_all[0].named_parameters())[embedding],
                           dict(replayed[0].named_parameters())[embedding])

    model, table, edges = _setup(False)
    runner = _replayed(model, two_rates(model))
    for idx, rel in batches[:3]:
        runner.train(edges, idx, rel, table, table)  # type: ignore[attr-defined]
    assert runner.notes == ["the relation optimizer's parameter groups have different rates (0.1, 0.025): those "  # type: ignore[attr-defined]
                            "steps are not replayed, each group trains at its own rate"]


def test_a_batch_larger_than_the_buffers_is_refused() -> None:
    model, table, edges = _setup(True)
    runner = make_runner(StepChoice("attention", capture="stand-in"), model, None, DEVICE, 8)
    with pytest.raises(ValueError, match="a batch of 9 edges is larger than the step's 8 rows"):
        runner.train(edges, torch.arange(9), None, table, table)


def test_fit_through_the_replay_driver_says_its_step_and_samples_its_violators(tmp_path: Path) -> None:
    """``fit --step attention --capture`` on a CPU: the run's line names the step, every bucket's
    stats say on how many edges its violators were counted, the checkpoint validates, and today's
    step resumes it."""
    from pbgio.cli import app as pbgio_app

    runner = CliRunner()
    assert runner.invoke(pbgio_app, ["example", str(tmp_path / "ex")]).exit_code == 0
    config = str(tmp_path / "ex" / "config.json")
    done = runner.invoke(app, ["fit", config, "--step", "attention", "--capture", "-p", "num_epochs=2",
                               "--no-progress"])
    assert done.exit_code == 0, done.output
    assert "step: softmax over negatives as attention, through the replay driver" in done.output
    assert "violators counted on the first 64 edges of each batch" in done.output
    lines = [json.loads(line) for line in (tmp_path / "ex" / "checkpoint" / "training_stats.json").read_text()
             .splitlines()]
    buckets = [line for line in lines if "lhs_partition" in line]
    assert buckets and all(0 < line["pbgtrain"]["violators_sampled_edges"] < line["stats"]["count"]
                           for line in buckets)
    assert runner.invoke(pbgio_app, ["validate", config]).exit_code == 0
    done = runner.invoke(app, ["fit", config, "--step", "scores", "-p", "num_epochs=3", "--no-progress"])
    assert done.exit_code == 0, done.output
    assert "step: score matrices" in done.output
    assert runner.invoke(pbgio_app, ["validate", config]).exit_code == 0


@pytest.mark.parametrize(("options", "message"), [
    (["--step", "attention", "-p", "loss_fn=ranking"],
     "--step attention: the attention form is the softmax loss's; this run's loss_fn is ranking"),
    (["--step", "attention", "-p", "comparator=l2"], "--step attention: the attention form scores by a dot product"),
    (["--capture", "-p", "max_norm=1"], "--capture: the step cannot be replayed: max_norm renormalises rows"),
    (["--capture", "-p", "num_machines=2"], "--capture: the step cannot be replayed: several trainers"),
])
def test_step_options_that_cannot_apply_to_the_config_exit_2_naming_the_option(tmp_path: Path, options: list[str],
                                                                message: str) -> None:
    from pbgio.cli import app as pbgio_app

    runner = CliRunner()
    assert runner.invoke(pbgio_app, ["example", str(tmp_path / "ex")]).exit_code == 0
    done = runner.invoke(app, ["fit", str(tmp_path / "ex" / "config.json"), *options, "--no-progress"])
    assert done.exit_code == 2, done.output
    assert message in " ".join(done.output.split())
    assert not (tmp_path / "ex" / "checkpoint" / "training_stats.json").exists()


def test_an_optimizer_state_that_decays_its_rate_is_trained_eagerly_and_said_so() -> None:
    """A relation optimizer loaded from a torch Adagrad state with ``lr_decay`` computes its rate
    from the step count on the host: the run goes on with the eager step, and says why."""
    model, table, edges = _setup(True)
    optimizer = make_relation_optimizer(model)
    assert optimizer is not None
    for group in optimizer.param_groups:
        group["lr_decay"] = 0.01
    runner = make_runner(StepChoice("attention", capture="stand-in"), model, optimizer, DEVICE, 16)
    assert not isinstance(runner, ReplayRunner)
    runner.reseed(0)
    runner.train(edges, torch.arange(16), None, table, table)
    assert runner.totals.take().count == 16
    assert runner.notes == ["the step is not replayed: the relation optimizer's state decays its rate with the "
                            "step count (lr_decay), which the host computes"]
