"""Warm start after ``pbgio import --append``: ``init_path`` tables with fewer rows than the grown
layout keep their rows and Adagrad sums, the new rows start as a fresh table's, the model and its
optimizer state carry over (dynamic operators grow), and training takes it from there."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, ModelState, write_checkpoint
from pbgio.config import load_config
from pbgio.entities import read_entity_count
from pbgio.errors import ConfigError
from pbgio.importers import import_edge_lists
from pbgio.importers.append import append_edge_lists
from pbgio.optimizer_state import decode_adagrad, decode_row_adagrad, encode_adagrad, encode_row_adagrad
from pbgio.validate import validate_path
from pbgtrain.checkpointing import TrainingCheckpoint, model_params
from pbgtrain.config import load_run_config
from pbgtrain.train import FitOptions, fit, resolve_fit
from pbgtrain.training.trainer import Trainer
from tests.shared import shared_path

STATIC = {
    "entities": {"user": {"num_partitions": 2}, "item": {"num_partitions": 1}},
    "relations": [{"name": "follows", "lhs": "user", "rhs": "user", "operator": "translation"},
                  {"name": "likes", "lhs": "user", "rhs": "item", "operator": "diagonal"}],
    "dimension": 8, "init_scale": 0.1, "comparator": "dot", "loss_fn": "softmax", "lr": 0.1, "batch_size": 50,
    "num_batch_negs": 10, "num_uniform_negs": 10, "num_epochs": 2, "workers": 1,
    "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model",
}
DYNAMIC = {
    "entities": {"n": {"num_partitions": 2}},
    "relations": [{"name": "all", "lhs": "n", "rhs": "n", "operator": "complex_diagonal"}],
    "dynamic_relations": True, "global_emb": False, "dimension": 8, "init_scale": 0.1, "comparator": "dot",
    "loss_fn": "softmax", "lr": 0.1, "batch_size": 50, "num_batch_negs": 10, "num_uniform_negs": 10,
    "num_epochs": 2, "workers": 1, "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model",
}
TYPES = {"user": 2, "item": 1}


def rows(seed: int, n: int, users: range, items: range) -> str:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            out.append(f"u{rng.choice(users)}\tfollows\tu{rng.choice(users)}\n")
        else:
            out.append(f"u{rng.choice(users)}\tlikes\ti{rng.choice(items)}\n")
    return "".join(out)


def trained_then_appended(root: Path, config: dict[str, object] | None = None, old: str | None = None,
                          new: str | None = None) -> tuple[Path, Path]:
    """A layout trained into ``model/`` (2 epochs), then grown by an append; returns the config
    and a second config warm-starting ``model2/`` from ``model/``."""
    root.mkdir(parents=True)
    path = root / "config.json"
    path.write_text(json.dumps(config or STATIC))
    (root / "old.tsv").write_text(old or rows(1, 800, range(50), range(20)))
    import_edge_lists(path, [root / "old.tsv"])
    fit(load_run_config(path), FitOptions(seed=2))
    (root / "new.tsv").write_text(new or rows(3, 300, range(30, 70), range(15, 30)))
    append_edge_lists(path, [root / "new.tsv"], seed=1)
    warm = json.loads(path.read_text())
    warm.update(checkpoint_path="model2", init_path="model")
    second = root / "warm.json"
    second.write_text(json.dumps(warm))
    return path, second


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return trained_then_appended(tmp_path_factory.mktemp("warm") / "layout")


def old_tables(model: Path) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    ckpt = CheckpointDir(model)
    out = {}
    for etype, parts in TYPES.items():
        for part in range(parts):
            state = ckpt.read_embeddings(etype, part)
            sums = decode_row_adagrad(state.optimizer_state, "x", count=len(state.embeddings))
            out[(etype, part)] = (state.embeddings, sums)
    return out


def test_load_keeps_old_rows_and_sums_and_initialises_new_ones(grown: tuple[Path, Path]) -> None:
    config, warm = grown
    root = config.parent
    cfg = load_config(warm)
    old = old_tables(root / "model")
    counts = {(t, p): read_entity_count(root / "data", t, p) for t, n in TYPES.items() for p in range(n)}
    assert all(counts[k] > len(old[k][0]) for k in counts), "the append should grow every table"
    ckpt = TrainingCheckpoint(root / "model2", cfg, init_path=root / "model", seed=5, counts=counts)
    fresh_values = []
    for key, count in counts.items():
        table = ckpt.load(*key, count)
        stored, sums = old[key]
        n = len(stored)
        assert table.weights.shape == (count, 8) and table.adagrad_sum.shape == (count,)
        assert torch.equal(table.weights[:n], torch.from_numpy(stored))  # bit for bit
        assert torch.equal(table.adagrad_sum[:n], torch.from_numpy(sums)) and bool((sums > 0).any())
        assert torch.equal(table.adagrad_sum[n:], torch.zeros(count - n))
        fresh = ckpt.fresh(*key, count)  # the rows a fresh table of this partition would have
        assert torch.equal(table.weights[n:], fresh[n:])
        fresh_values.append(table.weights[n:].flatten())
    values = torch.cat(fresh_values)
    assert len(values) >= 200
    assert abs(float(values.mean())) < 0.03 and 0.08 < float(values.std()) < 0.12  # init_scale 0.1 · N(0, 1)


def test_init_path_that_grew_validates_and_a_larger_one_does_not(grown: tuple[Path, Path], tmp_path: Path) -> None:
    config, warm = grown
    assert validate_path(warm).ok, validate_path(warm).issues  # init_path may have fewer rows
    report = validate_path(config)  # the run's own checkpoint_path may not
    shapes = [i for i in report.errors if i.rule == "embeddings-shape"]
    assert not report.ok and len(shapes) == 3
    assert "after pbgio import --append, warm start a new checkpoint_path from it with init_path" in shapes[0].message
    cfg = load_config(warm)
    ckpt = TrainingCheckpoint(tmp_path / "m", cfg, init_path=config.parent / "model")
    with pytest.raises(ConfigError, match=r"expected shape \(3, 8\)"):  # more rows stored than counted
        ckpt.load("user", 0, 3)


def test_continuing_the_old_checkpoint_in_place_is_refused(grown: tuple[Path, Path]) -> None:
    config, _ = grown
    with pytest.raises(Exception, match="warm start a new checkpoint_path"):
        fit(load_run_config(config, ["num_epochs=3"]), FitOptions(seed=2))


def test_model_and_optimizer_state_carry_over(grown: tuple[Path, Path]) -> None:
    config, warm = grown
    stored = CheckpointDir(config.parent / "model").read_model()
    trainer = Trainer(resolve_fit(load_run_config(warm), FitOptions(seed=5)))
    params = model_params(trainer.model)
    assert params.keys() == stored.params.keys()
    for name, value in stored.params.items():
        np.testing.assert_array_equal(params[name], value)
    assert trainer.optimizer is not None and stored.optimizer_state
    shapes = [tuple(p.shape) for g in trainer.optimizer.param_groups for p in g["params"]]
    decoded = decode_adagrad(stored.optimizer_state, "model", shapes)
    assert decoded is not None
    live = trainer.optimizer.state_dict()["state"]
    for index, entry in decoded["state"].items():
        np.testing.assert_array_equal(live[index]["sum"].numpy(), entry["sum"])
        assert float(live[index]["step"]) == float(entry["step"]) > 0


def test_fit_starts_from_the_grown_tables(grown: tuple[Path, Path], tmp_path: Path) -> None:
    """lr 0: one iteration commits exactly the warm start (old rows, fresh new rows); with a learning
    rate, training from the grown init_path equals training from a checkpoint that holds those
    grown tables already: the growth adds nothing but the initial rows."""
    config, warm = grown
    root = config.parent
    old = old_tables(root / "model")
    result = fit(load_run_config(warm, ["lr=0", "relation_lr=0", "checkpoint_path=still"]),
                 FitOptions(seed=5, max_iterations=1))
    assert result.final_version == 1
    still = CheckpointDir(root / "still")
    cfg = load_config(warm)
    ckpt = TrainingCheckpoint(tmp_path / "unused", cfg, seed=5)
    grown_tables = {}
    for key, (stored, sums) in old.items():
        state = still.read_embeddings(*key)
        n, count = len(stored), len(state.embeddings)
        np.testing.assert_array_equal(state.embeddings[:n], stored)
        np.testing.assert_array_equal(state.embeddings[n:], ckpt.fresh(*key, count)[n:].numpy())
        full_sums = np.concatenate([sums, np.zeros(count - n, np.float32)])
        grown_tables[key] = EmbeddingsState(np.concatenate([stored, ckpt.fresh(*key, count)[n:].numpy()]),
                                            encode_row_adagrad(full_sums, lr=0.1))
    # the same start written out by hand, as a checkpoint of the grown size
    model = CheckpointDir(root / "model").read_model()
    write_checkpoint(CheckpointDir(root / "by_hand"), 1, config=load_config(config), model=model,
                     embeddings=grown_tables)
    fit(load_run_config(warm), FitOptions(seed=5, max_iterations=1))
    fit(load_run_config(warm, ["init_path=by_hand", "checkpoint_path=model3"]), FitOptions(seed=5, max_iterations=1))
    a, b = CheckpointDir(root / "model2"), CheckpointDir(root / "model3")
    for key, (stored, _) in old.items():
        trained = a.read_embeddings(*key).embeddings
        np.testing.assert_array_equal(trained, b.read_embeddings(*key).embeddings)
        assert not np.array_equal(trained[: len(stored)], stored)  # and training did change them
    for name, value in a.read_model().params.items():
        np.testing.assert_array_equal(value, b.read_model().params[name])
    assert validate_path(warm).ok


def test_dynamic_relations_grow_with_the_model(tmp_path: Path) -> None:
    old = "".join(f"n{i}\tr{i % 3}\tn{(i * 7) % 40}\n" for i in range(400))
    new = "".join(f"n{i % 60}\tr{i % 5}\tn{(i * 3) % 55}\n" for i in range(200))
    config, warm = trained_then_appended(tmp_path / "dyn", DYNAMIC, old, new)
    root = config.parent
    assert (root / "data/dynamic_rel_count.txt").read_text().strip() == "5"
    stored = CheckpointDir(root / "model").read_model()
    assert validate_path(warm).ok, validate_path(warm).issues
    drawn = model_params(Trainer(resolve_fit(load_run_config(warm), FitOptions(seed=5))).model)
    trainer = Trainer(resolve_fit(load_run_config(warm), FitOptions(seed=5, operator_init="identity")))
    params = model_params(trainer.model)
    for name, value in stored.params.items():
        assert value.shape[0] == 3 and params[name].shape == (5, *value.shape[1:])
        np.testing.assert_array_equal(params[name][:3], value)
        fresh = np.ones_like(params[name][3:]) if name.endswith("real") else np.zeros_like(params[name][3:])
        np.testing.assert_array_equal(params[name][3:], fresh)  # as a fresh complex_diagonal operator
        np.testing.assert_array_equal(drawn[name][:3], value)  # by default, the new rows are drawn
        assert not np.array_equal(drawn[name][3:], fresh)
    assert trainer.optimizer is not None
    names = [n for n, _ in trainer.model.named_parameters()]
    stored_shapes = [value.shape for value in stored.params.values()]
    decoded = decode_adagrad(stored.optimizer_state or b"", "model", [tuple(s) for s in stored_shapes])
    assert decoded is not None and len(names) == len(decoded["state"])
    live = trainer.optimizer.state_dict()["state"]
    for index, entry in decoded["state"].items():
        np.testing.assert_array_equal(live[index]["sum"].numpy()[:3], entry["sum"])
        assert not live[index]["sum"].numpy()[3:].any()
    result = fit(load_run_config(warm), FitOptions(seed=5, max_iterations=2))
    assert result.final_version == 2 and validate_path(warm).ok


def test_model_with_more_relations_than_the_layout_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "m"
    root.mkdir()
    config = root / "config.json"
    config.write_text(json.dumps(DYNAMIC))
    (root / "e.tsv").write_text("a\tr\tb\nb\tr\tc\n")
    import_edge_lists(config, [root / "e.tsv"])
    cfg = load_config(config)
    too_many = {f"relations/0/operator/{side}/{p}": np.ones((3, 4), np.float32)
                for side in ("lhs", "rhs") for p in ("real", "imag")}
    write_checkpoint(CheckpointDir(root / "init"), 1, config=cfg,
                     model=ModelState(too_many, encode_adagrad([np.zeros((3, 4), np.float32)] * 4, lr=0.1)),
                     embeddings={("n", p): EmbeddingsState(np.zeros((read_entity_count(root / "data", "n", p), 8),
                                                                    np.float32)) for p in range(2)})
    with pytest.raises(Exception, match=r"model-param-shape|expected shape"):
        Trainer(resolve_fit(load_run_config(config, ["init_path=init"]), FitOptions()))


TOOL = Path(__file__).resolve().parents[1] / "tools" / "new_entities.py"


def test_new_entities_tool_skips_without_the_dataset(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(TOOL), "--archive", str(tmp_path / "absent.tar.gz")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("skipped: ") and "absent" in done.stdout


@pytest.mark.slow  # FB15k-237, tiny model: about 20 s on 2 cores
def test_new_entities_tool_runs(tmp_path: Path) -> None:
    archive = shared_path("datasets", "fb15k-237.tar.gz")
    out = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, str(TOOL), "--archive", str(archive), "--dimension", "10",
                           "--uniform-negs", "10", "--epochs", "1",
                           "--warm-epochs", "1", "--json", str(out), "--root", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    assert figures["held_out"] == 1454 and figures["append"]["new_entities"] >= 1454
    for key in ("initial_old", "warm_old", "warm_new", "baseline_old", "baseline_new"):
        assert 0 < figures[key]["mrr"] < 1 and figures[key]["count"] > 1000
    assert "append + warm start (+1 ep)" in done.stdout and not (tmp_path / "work").exists()
