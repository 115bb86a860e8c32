"""``pbgtrain fit --freeze TYPE`` (``FitOptions.frozen_types``): a frozen type's tables, their
row-wise Adagrad state and its global embedding stay bit for bit as loaded, in every committed
version, while the other types and the relation parameters train; a frozen type still gives
negatives; ``max_norm`` and N3 never write into it; mistakes are usage errors.

The example layout (``pbgio example``) has ``user`` (2 partitions) and ``item`` (1), with the
relations follows (user → user, translation) and likes (user → item, diagonal).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from pbgio.checkpoint import CheckpointDir
from pbgio.edges import EdgeBucket, FeatureLists, write_bucket
from pbgio.entities import write_entity_count
from pbgio.errors import UsageError
from pbgio.example import build_example
from pbgio.optimizer_state import decode_adagrad, decode_row_adagrad
from pbgio.spec import naming
from pbgio.spec.checkpoint import private_to_public
from pbgio.validate import validate_path
from pbgtrain.checkpointing import TrainingCheckpoint
from pbgtrain.cli import app
from pbgtrain.config import load_run_config
from pbgtrain.model import (
    EdgeBatch,
    EmbeddingModel,
    EntityTable,
    FeatureBags,
    ModelSpec,
    NegativeSampling,
    RelationSpec,
    forward_batch,
    make_relation_optimizer,
    train_step,
)
from pbgtrain.train import FitOptions, fit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distributed_runs import free_port, run_trainers, trainer_env, wait_all

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# lr 0.1 so that the loss visibly falls within a few iterations; one thread (a 2-core machine)
TRAIN = ["workers=1", "lr=0.1"]
USER_PARTS = [("user", 0), ("user", 1)]


@pytest.fixture(scope="session")
def example_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example layout, built once (its paths are relative: copies work)."""
    return build_example(tmp_path_factory.mktemp("example") / "layout", num_edges=2000).parent


@pytest.fixture
def example(example_template: Path, tmp_path: Path) -> Path:
    """A copy of the example layout (tests train in it); its config.json."""
    shutil.copytree(example_template, tmp_path / "layout")
    return tmp_path / "layout" / "config.json"


def _checkpoint(config: Path) -> CheckpointDir:
    return CheckpointDir(config.parent / "checkpoint")


def _tables(config: Path, version: int, keys: list[tuple[str, int]]) -> dict[tuple[str, int], Any]:
    ckpt = _checkpoint(config)
    return {key: ckpt.read_embeddings(key[0], key[1], version) for key in keys}


def _assert_same_tables(before: dict[tuple[str, int], Any], after: dict[tuple[str, int], Any]) -> None:
    """Embeddings bit-identical, the optimizer-state blob byte-identical (so its sums too)."""
    for key, old in before.items():
        new = after[key]
        assert new.embeddings.dtype == np.float32
        assert new.embeddings.tobytes() == old.embeddings.tobytes(), key
        assert new.optimizer_state == old.optimizer_state, key


def _model_state(config: Path, version: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The model file's parameters and Adagrad sums, both by public name."""
    run = load_run_config(config)
    model = EmbeddingModel.from_config(run.config)
    state = _checkpoint(config).read_model(version)
    names = [private_to_public(name) for name, _ in model.named_parameters()]
    decoded = decode_adagrad(state.optimizer_state, "model", [tuple(p.shape) for p in model.parameters()])
    assert decoded is not None
    sums = {str(name): np.asarray(decoded["state"][i]["sum"]) for i, name in enumerate(names)}
    return state.params, sums


def _losses(config: Path) -> list[float]:
    """The average training loss of each iteration, from training_stats.json."""
    per_iteration: dict[int, list[float]] = {}
    for line in _checkpoint(config).read_stats():
        if "stats" in line:
            per_iteration.setdefault(line["epoch_idx"], []).append(line["stats"]["metrics"]["loss"])
    return [float(np.mean(v)) for _, v in sorted(per_iteration.items())]


# --------------------------------------------------------------------------- end to end, CPU

def _freeze_user_after_one_iteration(config: Path, device: str = "cpu") -> None:
    """Train one iteration with nothing frozen (the user tables get Adagrad state), then freeze
    ``user`` (a partitioned type, 2 × 2 buckets) for four more, one ``fit`` per iteration: every
    committed version keeps the user tables, their state and their global embedding as in v1."""
    overrides = [*TRAIN, "num_epochs=5", "regularization_coef=1e-4"]
    fit(load_run_config(config, overrides), FitOptions(seed=1, max_iterations=1, device=device))
    users = _tables(config, 1, USER_PARTS)
    assert all(decode_row_adagrad(t.optimizer_state, "x").any() for t in users.values())  # a state to keep
    items = _tables(config, 1, [("item", 0)])
    params, sums = _model_state(config, 1)
    for version in range(2, 6):
        result = fit(load_run_config(config, overrides),
                     FitOptions(seed=1, max_iterations=1, device=device, frozen_types=frozenset({"user"})))
        assert result.final_version == version
        _assert_same_tables(users, _tables(config, version, USER_PARTS))
        new_params, new_sums = _model_state(config, version)
        user_emb = "entities/user/global_embedding"
        assert new_params[user_emb].tobytes() == params[user_emb].tobytes()
        assert new_sums[user_emb].tobytes() == sums[user_emb].tobytes()
        for name in ("entities/item/global_embedding", "relations/0/operator/rhs/translation",
                     "relations/1/operator/rhs/diagonal"):
            assert not np.array_equal(new_params[name], params[name]), name
            assert not np.array_equal(new_sums[name], sums[name]), name
        params, sums = new_params, new_sums
    after = _tables(config, 5, [("item", 0)])[("item", 0)]
    assert not np.array_equal(after.embeddings, items[("item", 0)].embeddings)
    assert validate_path(config.parent).ok
    losses = _losses(config)
    assert losses[-1] < losses[1], losses  # the unfrozen part learns while user stays put
    lines = [line for line in _checkpoint(config).read_stats() if "stats" in line]
    assert all(line["pbgtrain"].get("frozen_types") == (["user"] if line["epoch_idx"] else None) for line in lines)


def test_a_frozen_partitioned_type_stays_bit_identical_in_every_version(example: Path) -> None:
    _freeze_user_after_one_iteration(example)


def test_a_fresh_run_keeps_the_seeded_initialization_of_a_frozen_type(example: Path) -> None:
    """No checkpoint yet: the frozen unpartitioned type keeps its seeded init (zero Adagrad sums),
    in every version, also when swapped partitions stay in memory and are read ahead."""
    run = load_run_config(example, [*TRAIN, "num_epochs=3", "num_edge_chunks=2"])
    initial = TrainingCheckpoint(run.checkpoint_path, run.config, seed=4).load("item", 0, 40)
    users = {key: TrainingCheckpoint(run.checkpoint_path, run.config, seed=4).load(*key, 30) for key in USER_PARTS}
    for version in range(1, 7):
        fit(run, FitOptions(seed=4, max_iterations=1, frozen_types=frozenset({"item"}), partition_memory=1.0,
                            read_ahead_partitions=True))
        item = _checkpoint(example).read_embeddings("item", 0, version)
        assert item.embeddings.tobytes() == initial.weights.numpy().tobytes()
        assert not decode_row_adagrad(item.optimizer_state, "item").any()
        for key, table in users.items():
            trained = _checkpoint(example).read_embeddings(*key, version).embeddings
            assert not np.array_equal(trained, table.weights.numpy()), key
    assert validate_path(example.parent).ok


def test_a_type_warm_started_from_init_path_stays_as_loaded(tmp_path: Path) -> None:
    """A fresh checkpoint directory whose frozen type comes from another run's checkpoint (init_path)."""
    first = build_example(tmp_path / "first", num_edges=2000)
    fit(load_run_config(first, [*TRAIN, "num_epochs=1"]), FitOptions(seed=1))
    pretrained = _tables(first, 1, USER_PARTS)
    second = build_example(tmp_path / "second", num_edges=2000, seed=1)
    run = load_run_config(second, [*TRAIN, "num_epochs=2", f"init_path={first.parent / 'checkpoint'}"])
    for version in (1, 2):
        fit(run, FitOptions(seed=2, max_iterations=1, frozen_types=frozenset({"user"})))
        _assert_same_tables(pretrained, _tables(second, version, USER_PARTS))
    assert validate_path(second.parent).ok


def test_both_sides_frozen_the_operators_still_train(example: Path) -> None:
    run = load_run_config(example, [*TRAIN, "num_epochs=3"])
    fit(run, FitOptions(seed=2, max_iterations=1))
    keys = [*USER_PARTS, ("item", 0)]
    tables = _tables(example, 1, keys)
    params, _ = _model_state(example, 1)
    result = fit(run, FitOptions(seed=2, frozen_types=frozenset({"user", "item"})))
    assert result.final_version == 3
    _assert_same_tables(tables, _tables(example, 3, keys))
    after, _ = _model_state(example, 3)
    for name in params:
        changed = not np.array_equal(after[name], params[name])
        assert changed == name.startswith("relations/"), name  # global embeddings frozen with their types


def test_a_relation_with_nothing_to_train_is_skipped_while_the_others_train(example: Path) -> None:
    """follows (user → user) has operator none and no global embeddings: with user frozen its
    batches have no gradient at all (no backward), while likes trains item and its operator."""
    run = load_run_config(example, [*TRAIN, "num_epochs=2", "relations.0.operator=none", "global_emb=false"])
    fit(run, FitOptions(seed=3, max_iterations=1))
    users = _tables(example, 1, USER_PARTS)
    item = _tables(example, 1, [("item", 0)])[("item", 0)]
    fit(run, FitOptions(seed=3, frozen_types=frozenset({"user"})))
    _assert_same_tables(users, _tables(example, 2, USER_PARTS))
    assert not np.array_equal(_tables(example, 2, [("item", 0)])[("item", 0)].embeddings, item.embeddings)


def test_max_norm_and_n3_never_write_into_a_frozen_table(example: Path) -> None:
    """Initial rows have norm ~0.004: max_norm 0.002 clips every looked-up row, in place for the
    trained types, on the looked-up copy for the frozen one."""
    run = load_run_config(example, [*TRAIN, "num_epochs=2", "max_norm=0.002", "regularization_coef=0.1"])
    seeded = TrainingCheckpoint(run.checkpoint_path, run.config, seed=0)  # before any version exists
    initial = {key: seeded.load(*key, 30) for key in USER_PARTS}
    item = seeded.load("item", 0, 40).weights.numpy()
    assert all(float(t.weights.norm(dim=1).min()) > 0.002 for t in initial.values())
    fit(run, FitOptions(frozen_types=frozenset({"user"})))
    for key, table in initial.items():
        assert _tables(example, 2, [key])[key].embeddings.tobytes() == table.weights.numpy().tobytes()
    assert not np.array_equal(_tables(example, 2, [("item", 0)])[("item", 0)].embeddings, item)


def _featurized_layout(tmp_path: Path) -> Path:
    """user (plain) reads doc (featurized, 40 features): 600 edges, one bucket."""
    rng = np.random.default_rng(0)
    cfg = {
        "entities": {"user": {"num_partitions": 1}, "doc": {"num_partitions": 1, "featurized": True}},
        "relations": [{"name": "reads", "lhs": "user", "rhs": "doc", "operator": "diagonal"}],
        "dimension": 8, "comparator": "dot", "loss_fn": "softmax", "num_uniform_negs": 5, "num_batch_negs": 20,
        "batch_size": 100, "eval_fraction": 0.0, "num_epochs": 2, "lr": 0.1, "workers": 1,
        "entity_path": "entities", "edge_paths": ["edges"], "checkpoint_path": "ckpt",
    }
    write_entity_count(tmp_path / "entities", "user", 0, 30)
    write_entity_count(tmp_path / "entities", "doc", 0, 40)
    n = 600
    bags = [rng.integers(0, 40, rng.integers(1, 4)).tolist() for _ in range(n)]
    write_bucket(tmp_path / "edges" / naming.bucket_file(0, 0),
                 EdgeBucket(np.zeros(n, np.int64), rng.integers(0, 30, n), np.full(n, -1),
                            rhs_features=FeatureLists.from_lists(bags)))
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    return config


@pytest.mark.parametrize("frozen", ["doc", "user"])
def test_a_featurized_type_or_its_plain_partner_freezes(tmp_path: Path, frozen: str) -> None:
    config = _featurized_layout(tmp_path)
    run = load_run_config(config)
    fit(run, FitOptions(max_iterations=1))
    ckpt = CheckpointDir(tmp_path / "ckpt")
    before = {t: ckpt.read_embeddings(t, 0, 1) for t in ("user", "doc")}
    fit(run, FitOptions(frozen_types=frozenset({frozen})))
    for etype, old in before.items():
        new = ckpt.read_embeddings(etype, 0, 2)
        same = new.embeddings.tobytes() == old.embeddings.tobytes() and new.optimizer_state == old.optimizer_state
        assert same == (etype == frozen), etype
    assert validate_path(config).ok


# --------------------------------------------------------------------------- the step itself

def test_a_frozen_table_gets_no_gradient_and_still_gives_negatives() -> None:
    negatives = NegativeSampling(num_batch_negs=3, num_uniform_negs=4)
    spec = ModelSpec({"a": 4, "b": 4}, (RelationSpec("r", "a", "b", operator="diagonal"),), comparator="dot",
                     loss_fn="softmax", lr=0.1, relation_lr=0.1, max_norm=0.5, regularization_coef=0.1,
                     train_negatives=negatives, frozen=frozenset({"b"}))
    gen = torch.Generator().manual_seed(0)
    a, b = (EntityTable.random(10, 4, init_scale=1.0, generator=gen) for _ in range(2))
    b_weights, b_sums = b.weights.clone(), b.adagrad_sum.clone()
    a_weights = a.weights.clone()
    model = EmbeddingModel(spec)
    assert not model.global_embs["emb_b"].requires_grad and model.global_embs["emb_a"].requires_grad
    optimizer = make_relation_optimizer(model)
    assert optimizer is not None and len(optimizer.param_groups[0]["params"]) == 3  # frozen ones kept in place
    batch = EdgeBatch(torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6, 7]), rel=0)
    fwd = forward_batch(model, a, b, batch, negatives, generator=gen)
    assert [g.leaf.requires_grad for g in fwd.gathered] == [True, False]
    assert fwd.scores.rhs_neg.shape == (4, 3 + 4)  # b's batch and uniform negatives still scored
    for _ in range(3):
        train_step(model, a, b, batch, optimizer, generator=gen)
    assert torch.equal(b.weights, b_weights) and torch.equal(b.adagrad_sum, b_sums)
    assert not torch.equal(a.weights, a_weights)
    assert torch.equal(model.global_embs["emb_b"], torch.zeros(4))
    assert not torch.equal(model.global_embs["emb_a"], torch.zeros(4))


def test_max_norm_on_a_frozen_table_scores_as_the_in_place_clip() -> None:
    """The frozen lookup clips a copy: the same scores as clipping the table, which stays as it was."""
    negatives = NegativeSampling(num_batch_negs=3, num_uniform_negs=0)
    spec = ModelSpec({"e": 4}, (RelationSpec("r", "e", "e", operator="translation"),), comparator="cos",
                     max_norm=0.3, train_negatives=negatives, eval_negatives=negatives)
    table = EntityTable.random(8, 4, init_scale=1.0, generator=torch.Generator().manual_seed(2))
    batch = EdgeBatch(torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5]), rel=0)
    original = table.weights.clone()
    frozen_model = EmbeddingModel(dataclasses.replace(spec, frozen=frozenset({"e"})))
    frozen = forward_batch(frozen_model, table, table, batch, negatives, requires_grad=False).scores
    assert torch.equal(table.weights, original)
    clipped = forward_batch(EmbeddingModel(spec), table, table, batch, negatives, requires_grad=False).scores
    assert not torch.equal(table.weights, original)  # the unfrozen lookup clips in place
    assert torch.equal(frozen.lhs_pos, clipped.lhs_pos) and torch.equal(frozen.rhs_neg, clipped.rhs_neg)


def test_a_featurized_frozen_type_gets_no_gradient() -> None:
    negatives = NegativeSampling(num_batch_negs=4, num_uniform_negs=0)
    spec = ModelSpec({"author": 6, "doc": 6}, (RelationSpec("reads", "author", "doc", operator="diagonal"),),
                     comparator="dot", loss_fn="softmax", lr=0.1, relation_lr=0.1, train_negatives=negatives,
                     featurized=frozenset({"doc"}), frozen=frozenset({"doc"}))
    gen = torch.Generator().manual_seed(3)
    authors, features = (EntityTable.random(8, 6, init_scale=1.0, generator=gen) for _ in range(2))
    words = features.weights.clone()
    model = EmbeddingModel(spec)
    batch = EdgeBatch(torch.tensor([0, 1, 2, 3]), torch.full((4,), -1), 0,
                      rhs_bags=FeatureBags.of([[0, 3], [1], [2, 4, 5], [7, 6]]))
    train_step(model, authors, features, batch, make_relation_optimizer(model))
    assert torch.equal(features.weights, words) and not features.adagrad_sum.any()
    assert authors.adagrad_sum.any()


# --------------------------------------------------------------------------- mistakes

def test_an_unknown_type_is_a_usage_error_naming_the_known_types(example: Path) -> None:
    done = CliRunner().invoke(app, ["fit", str(example), "--freeze", "user", "--freeze", "users", "--no-progress"])
    assert done.exit_code == 2, done.output
    assert "--freeze: unknown entity type 'users'; the config's entity types are 'item', 'user'" in done.output
    assert not (example.parent / "checkpoint").exists()  # refused before anything was written
    with pytest.raises(UsageError, match="unknown entity type 'users'"):
        fit(load_run_config(example), FitOptions(frozen_types=frozenset({"users"})))


def test_nothing_left_to_train_is_refused(example: Path) -> None:
    overrides = ["relations.0.operator=none", "relations.1.operator=none"]
    args = ["fit", str(example), *(a for o in overrides for a in ("-p", o)), "--freeze", "user", "--freeze", "item"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 2, done.output
    assert "every entity type of the relations is frozen (item, user)" in done.output
    assert "nothing would train" in done.output
    with pytest.raises(UsageError, match="nothing would train"):
        fit(load_run_config(example, overrides), FitOptions(frozen_types=frozenset({"user", "item"})))
    # one unfrozen type, or an operator with parameters, is enough
    done = CliRunner().invoke(app, [*args[:-2], "-p", "num_epochs=1", "-p", "workers=1", "--no-progress"])
    assert done.exit_code == 0, done.output


# --------------------------------------------------------------------------- distributed runs

@pytest.mark.distributed
def test_two_trainers_keep_a_frozen_shared_type_and_train_the_rest(example: Path) -> None:
    """item is unpartitioned (shared state, all-reduced) and user partitioned (moved through the
    checkpoint directory): with item frozen, two trainers leave it and its global embedding as in
    v1 (agreed at the start, out of the rounds) while user and the operators train."""
    fit(load_run_config(example, [*TRAIN, "num_epochs=1"]), FitOptions(seed=1))
    item = _tables(example, 1, [("item", 0)])
    users = _tables(example, 1, USER_PARTS)
    params, sums = _model_state(example, 1)
    run_trainers(example, 2, overrides=[*TRAIN, "num_epochs=3"], extra=["--freeze", "item"])
    assert _checkpoint(example).read_version() == 3
    _assert_same_tables(item, _tables(example, 3, [("item", 0)]))
    after = _tables(example, 3, USER_PARTS)
    assert all(not np.array_equal(after[k].embeddings, users[k].embeddings) for k in USER_PARTS)
    new_params, new_sums = _model_state(example, 3)
    for name in params:
        frozen = name == "entities/item/global_embedding"
        assert (new_params[name].tobytes() == params[name].tobytes()) == frozen, name
        assert (new_sums[name].tobytes() == sums[name].tobytes()) == frozen, name
    assert validate_path(example.parent).ok


@pytest.mark.distributed
def test_trainers_freezing_different_types_are_refused(example: Path) -> None:
    port = free_port()
    common = ["-p", "num_machines=2", "-p", f"distributed_init_method=tcp://127.0.0.1:{port}", "-p", "workers=1",
              "--no-progress", "--peer-timeout", "20"]
    freezes: list[list[str]] = [["--freeze", "item"], []]
    procs = [subprocess.Popen([sys.executable, "-m", "pbgtrain", "fit", str(example), "--rank", str(rank), *common,
                               *freezes[rank]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=trainer_env()) for rank in range(2)]
    done = wait_all(procs, timeout=120)
    assert all(f.returncode != 0 for f in done)
    assert "rank 1 freezes [], rank 0 freezes ['item']: give every trainer the same --freeze" in done[1].stderr
    assert _checkpoint(example).read_version() == 0


# --------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@CUDA
def test_a_frozen_type_stays_bit_identical_on_cuda(example: Path) -> None:
    _freeze_user_after_one_iteration(example, device="cuda")
