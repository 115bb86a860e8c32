"""Validation-driven training (``pbgtrain fit --valid``): what was kept, why, and what it changed.

Each test reads back what the run recorded (``training_stats.json``, ``best/``) and checks it
against an independent measurement: the best version's files evaluate to the recorded MRR, an
unchanging model (learning rate 0) stops after exactly ``patience`` evaluations, and a decayed
learning rate trains bit for bit as the same run at the decayed rate.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.example import build_example
from pbgio.spec import naming
from pbgio.validate import validate_path
from pbgtrain.config import load_run_config
from pbgtrain.early_stopping import ValidationOptions
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
from pbgtrain.train import FitOptions, FitResult, fit
from pbgtrain.validation_log import validation_records
from tests.cli import pbgtrain


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("valid") / "example"
    build_example(root, num_edges=3000)
    return root


def _fit(example: Path, checkpoint: Path, overrides: list[str], validation: ValidationOptions | None) -> FitResult:
    run = load_run_config(example / "config.json", [f"checkpoint_path={checkpoint}", *overrides])
    return fit(run, FitOptions(validation=validation))


def _records(checkpoint: Path, example: Path) -> list[dict]:
    """The validation records of a run on the example's ``edges/test`` (recorded as the absolute path
    the option names: relative paths are relative to the config's folder)."""
    ckpt = CheckpointDir(checkpoint)
    return validation_records(ckpt.read_stats(), str(example / "edges" / "test"), ckpt.read_version())


def test_the_best_version_is_kept_and_evaluates_to_its_recorded_mrr(example: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "model"
    result = _fit(example, checkpoint, ["num_epochs=5", "lr=0.3"], ValidationOptions("edges/test"))
    records = _records(checkpoint, example)
    assert [r["version"] for r in records] == [1, 2, 3, 4, 5]
    best_so_far = -1.0
    for rec in records:  # each decision follows from the MRRs before it
        improved = rec["metrics"]["mrr"] > best_so_far
        assert rec["decision"] == ("best" if improved else "no improvement"), rec
        best_so_far = max(best_so_far, rec["metrics"]["mrr"])
        assert rec["best_mrr"] == best_so_far
    best = max(records, key=lambda r: (r["metrics"]["mrr"], -r["version"]))
    assert records[-1]["best_version"] == best["version"]
    assert result.best is not None and f"version {best['version']} " in result.best

    kept = checkpoint / naming.BEST_DIR
    assert CheckpointDir(kept).read_version() == best["version"]
    run = load_run_config(example / "config.json", [f"checkpoint_path={kept}"])
    assert sorted(p.name for p in kept.iterdir()) == sorted(
        [naming.CHECKPOINT_VERSION, naming.CONFIG_JSON, naming.model_file(best["version"]),
         *(naming.embeddings_file(t, p, best["version"]) for t, e in run.config.entities.items()
           for p in range(e.num_partitions))])
    edges = example / "edges"
    again = evaluate_checkpoint(run, EvalOptions(edge_paths=[edges / "test"],
                                                 filter_paths=[edges / "train", edges / "test"]))
    assert again.version == best["version"]
    assert again.metrics.mrr == pytest.approx(best["metrics"]["mrr"], abs=1e-12)
    report = validate_path(checkpoint, base=example)  # the layout, the checkpoint and its best/ snapshot
    assert report.ok, [str(i) for i in report.errors]


def test_an_unchanging_model_stops_after_patience_evaluations(example: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "model"
    result = _fit(example, checkpoint, ["num_epochs=10", "lr=0"], ValidationOptions("edges/test", patience=2))
    assert result.stopped_early and result.final_version == 3
    records = _records(checkpoint, example)
    assert [r["decision"] for r in records] == [
        "best", "no improvement", "no improvement; stop: 2 evaluation(s) without improvement (patience 2)"]
    assert CheckpointDir(checkpoint / naming.BEST_DIR).read_version() == 1
    assert CheckpointDir(checkpoint).read_version() == 3


def test_evaluations_every_n_epochs_and_after_the_last(example: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "model"
    _fit(example, checkpoint, ["num_epochs=5"], ValidationOptions("edges/test", every=2))
    assert [r["version"] for r in _records(checkpoint, example)] == [2, 4, 5]


def test_a_decayed_learning_rate_trains_as_the_same_run_at_that_rate_and_survives_a_resume(
        example: Path, tmp_path: Path) -> None:
    # Two epochs that cannot improve (lr 0): the second evaluation halves the learning rates.
    first = tmp_path / "decayed"
    decay = ValidationOptions("edges/test", lr_decay=0.5)
    _fit(example, first, ["num_epochs=2", "lr=0"], decay)
    assert [r["lr_scale"] for r in _records(first, example)] == [1.0, 0.5]
    plain = tmp_path / "plain"
    shutil.copytree(first, plain)
    entities = load_run_config(example / "config.json").config.entities
    keys = [(etype, part) for etype, entity in entities.items() for part in range(entity.num_partitions)]
    before = {key: CheckpointDir(plain).read_embeddings(*key, 2).embeddings for key in keys}
    # Resumed at lr 0.2 with the decay recorded, and at lr 0.1 without validation: the same epoch.
    _fit(example, first, ["num_epochs=3", "lr=0.2"], decay)
    _fit(example, plain, ["num_epochs=3", "lr=0.1"], None)
    for key in keys:
        ours = CheckpointDir(first).read_embeddings(*key, 3).embeddings
        same = CheckpointDir(plain).read_embeddings(*key, 3).embeddings
        assert not np.array_equal(same, before[key]), "the third epoch trained nothing"
        assert np.array_equal(ours.view(np.uint32), same.view(np.uint32)), key
    a, b = CheckpointDir(first).read_model(3).params, CheckpointDir(plain).read_model(3).params
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(("args", "message"), [
    (["--patience", "2"], "go with --valid"),
    (["--valid", "edges/test", "--lr-decay", "1.5"], "--lr-decay: expected a factor between 0 and 1"),
    (["--valid", "edges/test", "--eval-every", "0"], "--eval-every: expected a number of epochs ≥ 1"),
])
def test_options_that_cannot_run_are_refused_before_training(example: Path, tmp_path: Path, args: list[str],
                                                             message: str) -> None:
    done = pbgtrain("fit", str(example / "config.json"), "-p", f"checkpoint_path={tmp_path / 'm'}", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "m").exists()


def test_a_missing_validation_path_is_named(example: Path, tmp_path: Path) -> None:
    done = pbgtrain("fit", str(example / "config.json"), "-p", f"checkpoint_path={tmp_path / 'm'}",
                    "--valid", str(tmp_path / "nowhere"))
    assert done.returncode == 2, done.stderr  # a missing input path is a usage error
    assert "--valid directory does not exist" in done.stderr and str(tmp_path / "nowhere") in done.stderr
    assert not (tmp_path / "m" / naming.CHECKPOINT_VERSION).exists()


def test_a_run_stopped_by_another_rule_has_its_last_version_evaluated(example: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "model"
    run = load_run_config(example / "config.json", [f"checkpoint_path={checkpoint}", "num_epochs=10"])
    result = fit(run, FitOptions(max_iterations=3, validation=ValidationOptions("edges/test", every=2)))
    assert result.stopped_early and result.final_version == 3
    assert [r["version"] for r in _records(checkpoint, example)] == [2, 3]  # due at 2; 3 because the run stops there
