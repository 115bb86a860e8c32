"""One evaluation plan (issue 48, "each rule once"): how edges are ranked is decided in one place,
:class:`pbgtrain.ranking.EvalPlan`, which the held-out figures of ``fit`` and ``pbgtrain eval``
(``fit --valid`` too) both build and use.

Its behaviour (the batch negatives at most a batch, sampled ranking or every entity, the protocol
each states, the batch loop), and a guard on the sources of pbgtrain: the rule, the choice and the
loop have no second copy.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

from pbgio.config import ConfigSchema, parse_config
from pbgtrain.metrics import EvalProtocol, RankingAccumulator
from pbgtrain.model import BucketEdges, EmbeddingModel, EntityTable, ModelSpec, eval_step
from pbgtrain.ranking import EvalPlan, add_negative_scores, rank_all_entities
from pbgtrain.training.held_out import HeldOutRanking

ROOT = Path(__file__).resolve().parents[1]
PLAN_MODULE = "pbgtrain/ranking.py"


def config(**overrides: Any) -> ConfigSchema:
    raw = {"entities": {"e": {"num_partitions": 1}}, "dimension": 4, "entity_path": "data",
           "relations": [{"name": "r", "lhs": "e", "rhs": "e"}, {"name": "s", "lhs": "e", "rhs": "e"}],
           "edge_paths": ["data/edges"], "checkpoint_path": "model", "batch_size": 10, "num_batch_negs": 10,
           "eval_num_batch_negs": 30, "eval_num_uniform_negs": 5, "comparator": "dot", "loss_fn": "softmax"}
    return parse_config({**raw, **overrides})


def plan_of(cfg: ConfigSchema, counts: list[int], **kwargs: Any) -> EvalPlan:
    return EvalPlan.build(ModelSpec.from_config(cfg), cfg, counts, **kwargs)


# --------------------------------------------------------------------------- the plan


@pytest.mark.parametrize(("batch_size", "eval_num_batch_negs", "expected"), [(10, 30, 10), (50, 30, 30), (30, 30, 30)])
def test_batch_negatives_are_at_most_a_batch(batch_size: int, eval_num_batch_negs: int, expected: int) -> None:
    for held_out in (False, True):
        plan = plan_of(config(batch_size=batch_size, eval_num_batch_negs=eval_num_batch_negs), [1000],
                       held_out=held_out)
        assert (plan.num_batch_negs, plan.num_uniform_negs) == (expected, 5)
        assert plan.protocol.candidates == f"{expected} batch + 5 uniform negatives"
        assert not plan.every_entity


def test_every_entity_when_no_partition_has_more_entities_than_the_negatives() -> None:
    # 10 batch (at most a batch, not 30) + 5 uniform = 15 negatives
    assert plan_of(config(), [16]).every_entity is False
    assert plan_of(config(), [15]).every_entity is True
    assert plan_of(config(), [3, 15]).every_entity is True
    assert plan_of(config(), [16, 15]).every_entity is False  # the largest partition decides
    assert plan_of(config(), [1000], all_entities=True).every_entity is True  # asked for


def test_featurized_types_keep_sampled_ranking() -> None:
    cfg = config(entities={"e": {"num_partitions": 1, "featurized": True}})
    plan = plan_of(cfg, [3])
    assert not plan.every_entity
    assert plan.protocol.candidates == "10 batch + 5 uniform negatives (featurized sides: batch negatives only)"
    assert plan.featurized_sides == ((True, True), (True, True))


def test_each_ranker_states_its_protocol() -> None:
    held_out = plan_of(config(), [12, 7], held_out=True)
    assert held_out.with_loss and held_out.protocol == EvalProtocol(
        False, "all entities of the partition as candidates (at most 12, no more than the 15 eval negatives)")
    evaluated = plan_of(config(), [12, 7])
    assert not evaluated.with_loss
    assert evaluated.protocol.describe() == "raw, all 7–12 entities as candidates, both sides averaged"
    partitioned = config(entities={"e": {"num_partitions": 2}})
    assert plan_of(partitioned, [12, 12], filter_sources=["train", "valid"], all_entities=True).protocol.describe() \
        == "filtered (against train+valid), all 12 entities of the partition as candidates, both sides averaged"
    one_side = config(disable_lhs_negs=True)
    assert plan_of(one_side, [1000]).protocol.describe() == "raw, 10 batch + 5 uniform negatives, rhs side only"
    assert plan_of(one_side, [1000], held_out=True).protocol.sides == ("lhs", "rhs")


def test_held_out_ranking_uses_the_plan() -> None:
    cfg = config()
    model = EmbeddingModel(ModelSpec.from_config(cfg))
    ranking = HeldOutRanking(model, cfg, {("e", 0): 12}.values(), seed=0)
    assert ranking.plan == plan_of(cfg, [12], held_out=True)


# --------------------------------------------------------------------------- the batch loop


def _edges(n: int, num_entities: int) -> BucketEdges:
    g = torch.Generator().manual_seed(1)
    return BucketEdges(torch.randint(num_entities, (n,), generator=g), torch.randint(num_entities, (n,), generator=g),
                       torch.randint(2, (n,), generator=g), None, None, None)


def _loop(plan: EvalPlan, model: EmbeddingModel, table: EntityTable, edges: BucketEdges, sel: torch.Tensor,
          r: int, generator: torch.Generator) -> RankingAccumulator:
    """What held_out.py and evaluate.py each ran before the plan, batch by batch (the reference)."""
    acc = RankingAccumulator(plan.protocol, seed=3)
    if plan.every_entity and not plan.with_loss:
        rank_all_entities(acc, model, table, table, edges.lhs[sel], r, edges.rhs[sel])
        return acc
    for start in range(0, len(sel), plan.batch_size):
        batch = edges.batch(sel[start:start + plan.batch_size], r)
        result = eval_step(model, table, table, batch, generator=generator)
        if plan.every_entity:
            rank_all_entities(acc, model, table, table, batch.lhs, batch.rel, batch.rhs)
        else:
            add_negative_scores(acc, result.scores)
        acc.add_loss(result.loss, result.count)
    return acc


@pytest.mark.parametrize(("num_entities", "held_out"), [(100, False), (100, True), (12, False), (12, True)])
def test_rank_is_the_batch_loop_of_both_rankers(num_entities: int, held_out: bool) -> None:
    cfg = config()
    model = EmbeddingModel(ModelSpec.from_config(cfg))
    table = EntityTable.random(num_entities, 4, generator=torch.Generator().manual_seed(0))
    edges = _edges(37, num_entities)
    sel = (edges.rel == 1).nonzero().squeeze(1)
    plan = plan_of(cfg, [num_entities], held_out=held_out)
    assert plan.every_entity == (num_entities == 12)
    ours, theirs = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    acc = RankingAccumulator(plan.protocol, seed=3)
    plan.rank(acc, model, table, table, edges, sel, 1, ours)
    expected = _loop(plan, model, table, edges, sel, 1, theirs)
    assert repr(acc.result()) == repr(expected.result())  # the same ranks, AUC pairs and loss
    assert torch.equal(ours.get_state(), theirs.get_state())  # the same draws, in the same order
    if plan.every_entity and not held_out:  # eval against every entity: no loss, no draw
        assert acc.result().loss is None
        assert torch.equal(ours.get_state(), torch.Generator().manual_seed(5).get_state())
    else:
        assert acc.result().loss is not None


# --------------------------------------------------------------------------- no second copy


def _modules() -> dict[str, ast.Module]:
    return {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
            for path in sorted((ROOT / "pbgtrain").rglob("*.py"))}


def _names(node: ast.AST) -> set[str]:
    """The identifiers ``node`` mentions: names, attributes, and string constants."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.add(sub.value)
    return found


def _called(call: ast.Call) -> str:
    """The dotted name a call calls (``EvalProtocol.sampled``, ``self.plan.rank``; ``""`` for others)."""
    parts, func = [], call.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def _calls_to(call: ast.Call, what: str) -> bool:
    """Whether ``call`` calls ``what``, or one of its methods (``what.…``), however reached (``….what``)."""
    name = _called(call)
    return what in name.split(".")


def _calls(tree: ast.Module) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _min_of_batch_negs_and_batch(call: ast.Call) -> bool:
    """``min(…num_batch_negs…, …batch_size…)`` in any order or spelling of either."""
    if _called(call) != "min":
        return False
    names = set().union(*(_names(arg) for arg in call.args)) if call.args else set()
    return any("batch_negs" in n for n in names) and any("batch_size" in n for n in names)


TRAINING_CHUNK = {"pbgtrain/model/step_choice.py"}
"""Modules with a ``min(num_batch_negs, batch_size)`` of another rule: the training negatives' chunk
(:func:`pbgtrain.model.step_choice.keys_per_edge`), not the evaluation's."""


def test_guard_spots_each_form_of_the_copy() -> None:
    """The guard's own check: each way a copy could come back is caught."""
    for source in ("num_batch_negs = min(neg.num_batch_negs, config.batch_size)",
                   "x = min(cfg.batch_size, spec.eval_negatives.num_batch_negs) + neg.num_uniform_negs",
                   "n = min(num_batch_negs, batch_size)"):
        assert [c for c in _calls(ast.parse(source)) if _min_of_batch_negs_and_batch(c)], source
    assert not [c for c in _calls(ast.parse("min(negatives.num_batch_negs, num_pos)"))
                if _min_of_batch_negs_and_batch(c)]


def test_the_batch_negatives_rule_has_one_place() -> None:
    found = {name: sum(map(_min_of_batch_negs_and_batch, _calls(tree))) for name, tree in _modules().items()}
    copies = {name: n for name, n in found.items() if n and name not in TRAINING_CHUNK}
    assert copies == {PLAN_MODULE: 1}, f"min(eval batch negatives, batch size) outside EvalPlan.build: {copies}"


@pytest.mark.parametrize(("what", "allowed"), [
    # the choice of every entity over sampled negatives, and what they are
    ("ranks_every_entity", {PLAN_MODULE}),
    ("eval_negatives", {PLAN_MODULE, "pbgtrain/model/model.py", "pbgtrain/model/step.py"}),
    # the protocol a ranking states, built from the plan's choice
    ("EvalProtocol", {PLAN_MODULE, "pbgtrain/metrics.py"}),
    # the batch loop: a batch's eval step, then its ranks (sampled, or against every entity)
    ("eval_step", {PLAN_MODULE, "pbgtrain/model/step.py"}),
    ("rank_all_entities", {PLAN_MODULE}),
    ("add_negative_scores", {PLAN_MODULE}),
])
def test_the_choice_and_the_loop_have_one_place(what: str, allowed: set[str]) -> None:
    """Each is called (or, for ``eval_negatives``, read) in its own module only: a second
    ranker would call them again, and copy the plan."""
    used = set()
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            called = isinstance(node, ast.Call) and _calls_to(node, what)
            read = what == "eval_negatives" and isinstance(node, ast.Attribute) and node.attr == what
            if called or read:
                used.add(name)
    assert used <= allowed, f"{what} used outside the evaluation plan: {sorted(used - allowed)}"
    assert PLAN_MODULE in used


def test_both_rankers_build_the_plan_and_rank_with_it() -> None:
    modules = _modules()
    for name in ("pbgtrain/training/held_out.py", "pbgtrain/evaluate.py"):
        calls = {_called(call) for call in _calls(modules[name])}
        assert "EvalPlan.build" in calls, name
        handed = {_called(ast.Call(func=arg, args=[], keywords=[])) for call in _calls(modules[name])
                  if _called(call) == "partial" for arg in call.args[:1]}  # partial(plan.rank, …): called in pieces
        assert any(c.endswith("plan.rank") for c in calls | handed), name
