"""Ours → theirs: what ``pbgio import`` + ``pbgtrain fit`` write, the original reads, loads,
steps and keeps training; then ours resumes from what the original wrote (ping-pong).

Per cell of the matrix (``interop_cells.CELLS``): import the generated edge lists with pbgio,
train ``EPOCHS`` epochs with pbgtrain, then let the original's own readers and model look at
the result (``original_driver.py inspect``), each check in its own test:

* the checkpoint's ``config.json`` passes ``ConfigSchema.from_dict`` (and round-trips);
* ``CheckpointManager.read`` gives every partition bit for bit as pbgio reads it;
* ``make_model(config).load_state_dict(read_model(), strict=False)``: no missing/unexpected key;
* the model optimizer state loads into ``AsyncAdagrad`` and steps, aligned with the parameters;
* every partition's optimizer state loads into ``RowAdagrad`` and steps;
* every ``training_stats.json`` line passes ``Stats.from_dict`` (as the trainer replays them);
* every chunk of every bucket, and the entity counts and names, read the same;
* ``torchbiggraph_train`` trains one more epoch from our checkpoint and commits a version; then
  ``pbgio validate`` is clean, ``pbgtrain fit`` resumes one more epoch, and validate is clean.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from interop_cells import CELLS, Cell, CellRun
from interop_checks import (
    check_buckets_and_entities,
    check_carried_over,
    check_embedding_optimizers,
    check_model,
    check_model_optimizer,
    check_partitions,
    check_stats,
)
from interop_harness import (
    Original,
    OriginalFailed,
    copy_tree,
    failures_text,
    ours_fit,
    ours_import,
    ours_validate,
    rebase_config,
    validation_message,
    write_empty_edges,
    write_json,
)

from pbgio.checkpoint import CheckpointDir
from pbgio.config import parse_config
from pbgio.entities import read_dynamic_rel_count
from pbgtrain.model import EmbeddingModel

pytestmark = pytest.mark.interop


def prepare_ours(cell: Cell, root: Path) -> tuple[dict[str, Any], Path]:
    """Import with pbgio and train with pbgtrain (a seed checkpoint first for the init_path cell)."""
    train, test = cell.write_inputs(root)
    import_config = write_json(root / "import.json", cell.config(root, edge_paths=("train", "test")))
    ours_import(import_config, [train, test], weight_col=3 if cell.weighted else None)
    init = None
    if cell.init_path:
        seed = write_json(root / "seed.json", cell.config(root, checkpoint="seed_checkpoint", num_epochs=1))
        ours_fit(seed, seed=7)
        init = root / "seed_checkpoint"
    config = cell.config(root, init=init)
    config_path = write_json(root / "config.json", config)
    ours_fit(config_path)
    return config, config_path


@pytest.fixture(scope="module", params=CELLS, ids=[c.name for c in CELLS])
def ours_run(request: pytest.FixtureRequest, original: Original,
             tmp_path_factory: pytest.TempPathFactory) -> CellRun:
    cell: Cell = request.param
    root = tmp_path_factory.mktemp(f"o2t_{cell.name}")
    config, config_path = prepare_ours(cell, root)
    version = CheckpointDir(root / "checkpoint").read_version()
    assert version == cell.epochs * cell.num_chunks
    inspect = original.inspect(
        config, root / "inspect", edge_paths=[str(root / "edges" / "train"), str(root / "edges" / "test")],
        chunks=cell.num_chunks, extra_configs=[root / "checkpoint" / "config.json"])
    return CellRun(cell, root, config, config_path, version, inspect)


def test_checkpoint_config_json_accepted(ours_run: CellRun) -> None:
    path = ours_run.root / "checkpoint" / "config.json"
    got = ours_run.inspect["extra_configs"][str(path)]
    assert got["ok"], f"ConfigSchema.from_dict refuses our {path.name}: {got.get('error')}"
    ours = json.loads(path.read_text())
    assert got["to_dict"] == ours, "the original would write this config.json differently"


def test_partitions_read_bit_exact(ours_run: CellRun) -> None:
    problems = check_partitions(ours_run.inspect, ours_run.config)
    assert not problems, failures_text(problems)


def test_model_state_loads(ours_run: CellRun) -> None:
    problems = check_model(ours_run.inspect, ours_run.config)
    assert not problems, failures_text(problems)


def our_parameter_order(config: dict[str, Any]) -> list[str]:
    cfg = parse_config(config)
    num_dynamic = read_dynamic_rel_count(Path(config["entity_path"])) if cfg.dynamic_relations else None
    return [name for name, _ in EmbeddingModel.from_config(cfg, num_dynamic).named_parameters()]


def test_model_optimizer_loads_and_steps(ours_run: CellRun) -> None:
    problems = check_model_optimizer(ours_run.inspect, our_parameter_order(ours_run.config))
    assert not problems, failures_text(problems)


def test_embedding_optimizers_load_and_step(ours_run: CellRun) -> None:
    problems = check_embedding_optimizers(ours_run.inspect, ours_run.config)
    assert not problems, failures_text(problems)


def test_stats_lines_parse(ours_run: CellRun) -> None:
    problems = check_stats(ours_run.inspect)
    assert not problems, failures_text(problems)


def test_buckets_and_entities_read_identically(ours_run: CellRun) -> None:
    root = ours_run.root
    problems = check_buckets_and_entities(
        ours_run.inspect, ours_run.config, [str(root / "edges" / "train"), str(root / "edges" / "test")],
        ours_run.cell.num_chunks)
    assert not problems, failures_text(problems)


def test_original_trains_on_then_ours_resumes(ours_run: CellRun, original: Original, tmp_path: Path) -> None:
    """Ping-pong on a copy: ours (EPOCHS) → original (+1 epoch) → ours (+1 epoch), validate after each."""
    cell, epochs, chunks = ours_run.cell, ours_run.cell.epochs, ours_run.cell.num_chunks
    root = tmp_path / "pingpong"
    copy_tree(ours_run.root, root)
    config = rebase_config(ours_run.config, ours_run.root, root)
    config_path = write_json(root / "config.json", config)
    ckpt = CheckpointDir(root / "checkpoint")

    original.cli("train", config, [], workdir=tmp_path / "run", overrides=[f"num_epochs={epochs + 1}"])
    assert ckpt.read_version() == ours_run.version + chunks, \
        f"torchbiggraph_train committed version {ckpt.read_version()}, expected {ours_run.version + chunks}"
    report = ours_validate(config_path)
    assert report.ok, "after the original trained on: " + validation_message(report)

    ours_fit(config_path, [f"num_epochs={epochs + 2}"])
    assert ckpt.read_version() == ours_run.version + 2 * chunks
    report = ours_validate(config_path)
    assert report.ok, "after pbgtrain resumed from the original's checkpoint: " + validation_message(report)
    assert cell.name  # the cell ran end to end


def test_original_warm_starts_from_our_checkpoint(original: Original, tmp_path: Path) -> None:
    """init_path across implementations: the original starts a fresh run from our checkpoint. Over
    an edge path of empty buckets nothing moves, so the version it commits must hold our
    embeddings and model parameters bit for bit. (Not lr 0: the original takes the learning rate
    from the loaded optimizer state, not from the config.)"""
    cell = next(c for c in CELLS if c.init_path)
    root = tmp_path / "cell"
    config, _ = prepare_ours(cell, root)
    empty = write_empty_edges(root / "edges" / "empty", config)
    fresh = cell.config(root, checkpoint="theirs_from_ours", init=root / "checkpoint", num_epochs=1,
                        eval_fraction=0.0, edge_paths=[str(empty)])
    try:
        original.cli("train", fresh, [], workdir=tmp_path / "run")
    except OriginalFailed as exc:
        pytest.fail(f"the original cannot start from our checkpoint as init_path:\n{exc}")
    problems = check_carried_over(root / "checkpoint", root / "theirs_from_ours", config)
    assert not problems, failures_text(problems)


def test_original_resumes_a_validation_driven_run(original: Original, tmp_path: Path) -> None:
    """``fit --valid`` (best version kept in best/, validation lines in training_stats.json, the
    learning rate decayed) on the partitioned cell (2x2 buckets, 2 chunks, epoch snapshots): the
    original trains one more epoch from the checkpoint, best/ survives it intact, the directory
    validates, and pbgtrain resumes the validation where it was."""
    from pbgtrain.config import load_run_config
    from pbgtrain.early_stopping import ValidationOptions
    from pbgtrain.train import FitOptions, fit
    from pbgtrain.validation_log import validation_records

    cell = next(c for c in CELLS if c.name == "partitioned")
    root = tmp_path / "cell"
    train, test = cell.write_inputs(root)
    ours_import(write_json(root / "import.json", cell.config(root, edge_paths=("train", "test"))), [train, test])
    config = cell.config(root)
    config_path = write_json(root / "config.json", config)
    valid = str(root / "edges" / "test")
    options = FitOptions(validation=ValidationOptions(valid, lr_decay=0.5))
    fit(load_run_config(config_path), options)
    ckpt, best = CheckpointDir(root / "checkpoint"), CheckpointDir(root / "checkpoint" / "best")
    version, best_version = ckpt.read_version(), best.read_version()
    records = validation_records(ckpt.read_stats(), valid, version)
    assert len(records) == cell.epochs and records[-1]["best_version"] == best_version
    kept = {(name, part): best.read_embeddings(name, part).embeddings.copy()
            for name, entity in config["entities"].items() for part in range(entity["num_partitions"])}

    original.cli("train", config, [], workdir=tmp_path / "run", overrides=[f"num_epochs={cell.epochs + 1}"])
    assert ckpt.read_version() == version + cell.num_chunks
    assert best.read_version() == best_version
    for (name, part), rows in kept.items():
        assert (best.read_embeddings(name, part).embeddings == rows).all(), f"best/ {name}/{part} changed"
    report = ours_validate(config_path)
    assert report.ok, "after the original resumed a validation-driven checkpoint: " + validation_message(report)

    fit(load_run_config(config_path, [f"num_epochs={cell.epochs + 2}"]), options)
    again = validation_records(ckpt.read_stats(), valid, ckpt.read_version())
    assert len(again) == cell.epochs + 1 and again[:-1] == records  # carried on from the records before
    report = ours_validate(config_path)
    assert report.ok, "after pbgtrain resumed with --valid: " + validation_message(report)


def _resumed_by_the_original(original: Original, tmp_path: Path, cell_name: str, options: Any,
                             what: str) -> CheckpointDir:
    """Import and fit the cell with ``options``, validate, let the original train one more epoch,
    validate again, resume with pbgtrain (the same options) and validate: its checkpoint directory."""
    from pbgtrain.config import load_run_config
    from pbgtrain.train import fit

    cell = next(c for c in CELLS if c.name == cell_name)
    root = tmp_path / "cell"
    train, test = cell.write_inputs(root)
    ours_import(write_json(root / "import.json", cell.config(root, edge_paths=("train", "test"))), [train, test],
                weight_col=3 if cell.weighted else None)
    config = cell.config(root)
    config_path = write_json(root / "config.json", config)
    fit(load_run_config(config_path), options)
    report = ours_validate(config_path)
    assert report.ok, f"a checkpoint trained {what}: " + validation_message(report)
    ckpt = CheckpointDir(root / "checkpoint")
    version = ckpt.read_version()
    assert version > 0

    original.cli("train", config, [], workdir=tmp_path / "run", overrides=[f"num_epochs={cell.epochs + 1}"])
    assert ckpt.read_version() == version + cell.num_chunks
    report = ours_validate(config_path)
    assert report.ok, f"after the original resumed a run trained {what}: " + validation_message(report)
    fit(load_run_config(config_path, [f"num_epochs={cell.epochs + 2}"]), options)
    assert ckpt.read_version() == version + 2 * cell.num_chunks
    report = ours_validate(config_path)
    assert report.ok, f"after pbgtrain resumed the original's version of a run trained {what}: " + \
        validation_message(report)
    return ckpt


def test_original_resumes_a_run_trained_with_relation_prediction(original: Original, tmp_path: Path) -> None:
    """``fit --relation-prediction`` changes training only: on the dynamic-relations cell
    (complex_diagonal, dot, N3) its checkpoint validates, the original trains one more epoch from
    it, and the directory still validates and resumes in pbgtrain."""
    from pbgtrain.train import FitOptions

    ckpt = _resumed_by_the_original(original, tmp_path, "dynamic", FitOptions(relation_prediction=0.5),
                                    "with relation prediction")
    assert any(line.get("pbgtrain", {}).get("relation_prediction") == 0.5 for line in ckpt.read_stats())


@pytest.mark.parametrize("cell_name", ["static_unpart", "dynamic"])
def test_original_resumes_a_run_through_the_replay_driver(original: Original, tmp_path: Path, cell_name: str) -> None:
    """``fit --step attention --capture`` (the GPU's step: the softmax over negatives as attention,
    through the replay driver, which on a CPU calls the step's body where a GPU replays it) changes
    how a step computes, not what it writes: its checkpoint validates, the original trains one
    more epoch from it, and pbgtrain resumes the original's version with the same step."""
    from pbgtrain.train import FitOptions

    ckpt = _resumed_by_the_original(original, tmp_path, cell_name, FitOptions(step="attention", capture=True),
                                    "through the replay driver")
    ours = [line for line in ckpt.read_stats() if "lhs_partition" in line and "pbgtrain" in line]
    assert ours and all(line["pbgtrain"].get("violators_sampled_edges", 0) > 0 for line in ours)
