"""Tables and row-wise Adagrad by hand, evaluation scoring, and tiny models that must learn their graph."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from pbgtrain.model import (
    EdgeBatch,
    EmbeddingModel,
    EntityTable,
    ModelSpec,
    NegativeSampling,
    RelationSpec,
    eval_step,
    gather_rows,
    make_relation_optimizer,
    score_candidates,
    train_step,
)


def test_row_adagrad_by_hand_with_duplicate_rows() -> None:
    table = EntityTable(torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0], [-1.0, 3.0]]),
                        torch.tensor([0.0, 1.0, 0.0, 4.0]))
    # row 2 is looked up but gets a zero gradient with a zero accumulator: it must not move (eps)
    gathered, (rows,) = gather_rows(table, [torch.tensor([1, 1, 3, 2])], max_norm=None, requires_grad=True)
    coeffs = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [0.0, 0.0]])
    (rows * coeffs).sum().backward()
    gathered.apply_row_adagrad(lr=0.1)
    # row 1: g = (1+3, 2-1) = (4, 1), G = 1 + (16+1)/2 = 9.5; row 3: g = (0.5, 0.5), G = 4 + 0.25 = 4.25
    assert table.adagrad_sum.tolist() == pytest.approx([0.0, 9.5, 0.0, 4.25])
    expected = [[1.0, 1.0],
                [2.0 - 0.1 * 4 / math.sqrt(9.5), 0.0 - 0.1 * 1 / math.sqrt(9.5)],
                [0.0, 0.0],
                [-1.0 - 0.1 * 0.5 / math.sqrt(4.25), 3.0 - 0.1 * 0.5 / math.sqrt(4.25)]]
    torch.testing.assert_close(table.weights, torch.tensor(expected))


def test_gather_rows_returns_each_group_in_order() -> None:
    table = EntityTable(torch.arange(10.0).view(5, 2))
    _, (a, b) = gather_rows(table, [torch.tensor([4, 0]), torch.tensor([0, 0, 2])], max_norm=None,
                            requires_grad=False)
    assert a.tolist() == [[8.0, 9.0], [0.0, 1.0]]
    assert b.tolist() == [[0.0, 1.0], [0.0, 1.0], [4.0, 5.0]]


def test_entity_table_init_and_checks() -> None:
    table = EntityTable.random(2000, 50, init_scale=0.01, generator=torch.Generator().manual_seed(0),
                               entity_type="user", partition=3)
    assert table.weights.dtype == torch.float32 and table.adagrad_sum.shape == (2000,)
    assert table.weights.std().item() == pytest.approx(0.01, rel=0.02)
    assert not table.adagrad_sum.any()
    assert "user" in repr(table) and table.partition == 3
    with pytest.raises(ValueError, match="adagrad_sum"):
        EntityTable(torch.zeros(3, 2), torch.zeros(4))
    with pytest.raises(ValueError, match=r"\[N, D\]"):
        EntityTable(torch.zeros(3))


def test_edge_batch_checks_shapes() -> None:
    with pytest.raises(ValueError, match="rel"):
        EdgeBatch(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="weight"):
        EdgeBatch(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long), 0, torch.ones(2))


def test_model_rejects_inconsistent_specs() -> None:
    rel = RelationSpec("r", "a", "b")
    with pytest.raises(ValueError, match="equal dimensions"):
        EmbeddingModel(ModelSpec({"a": 2, "b": 4}, (rel,)))
    with pytest.raises(ValueError, match="dynamic"):
        EmbeddingModel(ModelSpec({"a": 2, "b": 2}, (rel,), num_dynamic_rels=3, global_emb=True))
    with pytest.raises(ValueError, match="unknown entity type"):
        EmbeddingModel(ModelSpec({"a": 2}, (rel,)))
    model = EmbeddingModel(ModelSpec({"a": 2, "b": 2}, (rel,)))
    with pytest.raises(TypeError, match="static relations"):
        model.relation(torch.zeros(2, dtype=torch.long))


def test_eval_step_uses_the_evaluation_negatives() -> None:
    spec = ModelSpec({"e": 4}, (RelationSpec("r", "e", "e"),), comparator="dot", loss_fn="softmax",
                     train_negatives=NegativeSampling(2, 3), eval_negatives=NegativeSampling(4, 7))
    model = EmbeddingModel(spec)
    table = EntityTable.random(20, 4, generator=torch.Generator().manual_seed(0))
    before = table.weights.clone()
    batch = EdgeBatch(torch.arange(8), torch.arange(8) + 10, 0)
    result = eval_step(model, table, table, batch)
    assert result.scores.lhs_neg.shape == (8, 4 + 7) and result.scores.rhs_neg.shape == (8, 4 + 7)
    assert result.count == 8 and result.loss > 0
    assert torch.equal(table.weights, before)


def _ranks(model: EmbeddingModel, table: EntityTable, lhs: Tensor, rel: int | Tensor, rhs: Tensor,
           side: str) -> Tensor:
    """Rank of the true entity among all others (its own column is excluded: the candidate score of
    the true entity equals ``pos`` only up to rounding)."""
    pos, scores = score_candidates(model, table, table, lhs, rel, rhs, side)
    truth = lhs if side == "lhs" else rhs
    scores[torch.arange(len(truth)), truth] = -math.inf
    return 1 + (scores > pos.unsqueeze(1)).sum(1)


def test_dynamic_complex_model_learns_a_planted_graph() -> None:
    torch.manual_seed(0)
    num_entities, num_rels = 8, 3
    heads = torch.arange(num_entities).repeat(num_rels)
    rels = torch.arange(num_rels).repeat_interleave(num_entities)
    tails = (heads * (rels + 1) + rels) % num_entities  # three different maps of the entities
    spec = ModelSpec({"e": 16}, (RelationSpec("all", "e", "e", operator="complex_diagonal"),),
                     num_dynamic_rels=num_rels, comparator="dot", loss_fn="softmax", regularization_coef=1e-4,
                     global_emb=False, init_scale=0.1, lr=0.2, relation_lr=0.2, train_negatives=NegativeSampling(8, 8))
    model = EmbeddingModel(spec)
    optimizer = make_relation_optimizer(model)
    table = EntityTable.random(num_entities, 16, init_scale=0.1, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(2)
    for _ in range(300):
        perm = torch.randperm(len(heads), generator=gen)
        train_step(model, table, table, EdgeBatch(heads[perm], tails[perm], rels[perm]), optimizer, generator=gen)
    for side in ("lhs", "rhs"):
        ranks = _ranks(model, table, heads, rels, tails, side)
        if side == "rhs":  # every map is a function of the head, so each true tail must rank first
            assert (ranks == 1).all(), ranks
        else:
            assert (1.0 / ranks.float()).mean() > 0.6


def test_static_translation_model_learns_a_chain() -> None:
    n = 10
    heads = torch.arange(n - 1)
    tails = heads + 1
    spec = ModelSpec({"node": 8}, (RelationSpec("next", "node", "node", operator="translation"),),
                     comparator="l2", loss_fn="ranking", margin=0.5, init_scale=0.1, lr=0.1, relation_lr=0.1,
                     train_negatives=NegativeSampling(5, 5))
    model = EmbeddingModel(spec)
    optimizer = make_relation_optimizer(model)
    table = EntityTable.random(n, 8, init_scale=0.5, generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(4)
    for _ in range(400):
        perm = torch.randperm(n - 1, generator=gen)
        train_step(model, table, table, EdgeBatch(heads[perm], tails[perm], 0), optimizer, generator=gen)
    assert (_ranks(model, table, heads, 0, tails, "rhs") == 1).all()
    assert (_ranks(model, table, heads, 0, tails, "lhs") == 1).all()


def test_empty_batch_is_a_no_op() -> None:
    spec = ModelSpec({"e": 2}, (RelationSpec("r", "e", "e"),))
    table = EntityTable.random(3, 2)
    before = table.weights.clone()
    empty = torch.zeros(0, dtype=torch.long)
    stats = train_step(EmbeddingModel(spec), table, table, EdgeBatch(empty, empty, 0), None)
    assert stats.count == 0 and torch.equal(table.weights, before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_step_matches_cpu() -> None:
    results = []
    for device in ("cpu", "cuda"):
        spec = ModelSpec({"e": 8}, (RelationSpec("r", "e", "e", operator="complex_diagonal"),), num_dynamic_rels=4,
                         comparator="dot", loss_fn="softmax", regularization_coef=1e-3, global_emb=False,
                         train_negatives=NegativeSampling(4, 6))
        model = EmbeddingModel(spec).double().to(device)
        gen = torch.Generator().manual_seed(0)
        table = EntityTable(torch.randn(30, 8, generator=gen, dtype=torch.float64).to(device))
        batch = EdgeBatch(torch.randint(30, (16,), generator=gen).to(device),
                          torch.randint(30, (16,), generator=gen).to(device),
                          torch.randint(4, (16,), generator=gen).to(device))
        negs = NegativeSampling(4, 0)  # no uniform sampling: CPU and CUDA generators differ
        stats = train_step(model, table, table, batch, make_relation_optimizer(model), negatives=negs)
        results.append((stats.loss, table.weights.cpu()))
    assert results[0][0] == pytest.approx(results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def _saved(state_dict: dict[str, Any]) -> bytes:
    import io

    out = io.BytesIO()
    torch.save(state_dict, out)
    return out.getvalue()


def _adagrad_pair(settings: dict[str, float | bool]) -> tuple[list[torch.nn.Parameter], Any,
                                                            list[torch.nn.Parameter], Any]:
    """The same two parameter groups under RelationAdagrad and torch.optim.Adagrad, ``settings``
    loaded into both from torch's state dict (as a checkpoint would carry them)."""
    from pbgtrain.model import RelationAdagrad

    gen = torch.Generator().manual_seed(3)
    values = [torch.randn(4, 3, generator=gen), torch.randn(5, generator=gen), torch.randn(2, 2, generator=gen)]
    ours = [torch.nn.Parameter(v.clone()) for v in values]
    theirs = [torch.nn.Parameter(v.clone()) for v in values]
    reference = torch.optim.Adagrad([{"params": theirs[:2]}, {"params": theirs[2:]}], lr=0.3, eps=1e-10)
    for group in reference.param_groups:
        group.update(settings)
    optimizer = RelationAdagrad([{"params": ours[:2]}, {"params": ours[2:]}], lr=0.3, eps=1e-10)
    optimizer.load_state_dict(reference.state_dict())
    return ours, optimizer, theirs, reference


@pytest.mark.parametrize("settings", [{}, {"lr_decay": 0.1}, {"weight_decay": 0.01}, {"maximize": True}])
def test_relation_adagrad_steps_and_states_as_torchs_adagrad(settings: dict[str, float | bool]) -> None:
    """Three steps (a parameter without a gradient in one of them) leave the parameters and the
    state dict torch.optim.Adagrad leaves, at the original's settings and at others a loaded
    state may carry."""
    ours, optimizer, theirs, reference = _adagrad_pair(settings)
    gen = torch.Generator().manual_seed(4)
    for k in range(3):
        grads = [torch.randn(p.shape, generator=gen) for p in ours]
        for i, (mine, torchs, grad) in enumerate(zip(ours, theirs, grads, strict=True)):
            mine.grad = torchs.grad = None if (k == 1 and i == 1) else grad.clone()
        optimizer.step()
        reference.step()
        optimizer.zero_grad()
        reference.zero_grad()
    for mine, torchs in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine.detach(), torchs.detach())
    got, want = optimizer.state_dict(), reference.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert [list(g) for g in got["param_groups"]] == [list(g) for g in want["param_groups"]]  # key order too
    assert _saved(got) == _saved(want)  # byte for byte: a checkpoint's blob is the same as torch's
    assert got["state"].keys() == want["state"].keys()
    for index, state in want["state"].items():
        assert got["state"][index].keys() == state.keys()
        for key, value in state.items():
            torch.testing.assert_close(got["state"][index][key], value)


def test_relation_adagrad_loads_an_older_torchs_state_and_refuses_other_groups() -> None:
    """``step`` stored as a number and hyperparameters missing (an older torch's state dict) load
    as torch's defaults; a state of other parameter groups is refused, naming both."""
    from pbgtrain.model import RelationAdagrad

    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    optimizer = RelationAdagrad([p], lr=0.5)
    optimizer.load_state_dict({"state": {0: {"step": 7, "sum": torch.tensor([1.0, 2.0])}},
                               "param_groups": [{"lr": 0.1, "eps": 1e-10, "params": [0]}]})
    state = optimizer.state[p]
    assert state["step"].dtype == torch.float32 and float(state["step"]) == 7
    assert state["sum"].dtype == torch.float64
    assert optimizer.param_groups[0]["lr_decay"] == 0 and optimizer.param_groups[0]["maximize"] is False
    with pytest.raises(ValueError, match=r"\[2\] parameters per group, this optimizer \[1\]"):
        optimizer.load_state_dict({"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]})


def test_fit_does_not_import_torch_dynamo(tmp_path: Path) -> None:
    """A fit's relation optimizer is not a torch.optim.Optimizer, whose construction imports
    torch._dynamo (about a second at every fit)."""
    code = ("import sys\n"
            "from pathlib import Path\n"
            "from pbgio.example import build_example\n"
            "from pbgtrain.config import load_run_config\n"
            "from pbgtrain.train import FitOptions, fit\n"
            "build_example(Path('ex'))\n"
            "fit(load_run_config(Path('ex/config.json'), ['num_epochs=1', 'checkpoint_path=ex/checkpoint']),"
            " FitOptions(check_layout=False))\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
