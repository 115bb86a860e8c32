"""Theirs → ours: what ``torchbiggraph_import_from_tsv`` + ``torchbiggraph_train`` write, pbgio
validates and reads exactly, pbgtrain resumes, and ``pbgio export`` exports as
``torchbiggraph_export_to_tsv`` does.

Per cell (``interop_cells.CELLS``): the original imports the generated edge lists (featurized
cells: the original has no importer for them, so ``pbgio import`` writes the layout) and trains
``EPOCHS`` epochs (a seed checkpoint first for the init_path cell, also by the original). Then:

* ``pbgio validate`` is clean on the layout and the checkpoint;
* pbgio reads every partition, model parameter, bucket chunk, count and name exactly as the
  original's own readers do (``original_driver.py inspect``);
* both exporters give the same entity vectors and relation parameters, on the original's
  checkpoint and again after ``pbgtrain fit`` resumed it for one more epoch (validated again).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from interop_cells import CELLS, Cell, CellRun
from interop_checks import check_buckets_and_entities, check_carried_over, check_model, check_partitions
from interop_harness import (
    Original,
    copy_tree,
    failures_text,
    ours_fit,
    ours_import,
    ours_validate,
    read_export_tsv,
    read_relations_tsv,
    rebase_config,
    validation_message,
    write_empty_edges,
    write_json,
)

from pbgio.checkpoint import CheckpointDir
from pbgio.exporters import export_embeddings, export_relations

pytestmark = pytest.mark.interop

EXPORT_ATOL = 1e-9
"""The original writes ``%.9f`` (rounding error <= 5e-10); pbgio writes float32 exactly."""


def prepare_theirs(cell: Cell, root: Path, original: Original) -> tuple[dict[str, Any], Path]:
    """Import (the original's importer, or pbgio's for featurized cells) and train with the original."""
    train, test = cell.write_inputs(root)
    import_config = cell.config(root, edge_paths=("train", "test"))
    if cell.featurized:
        ours_import(write_json(root / "import.json", import_config), [train, test])
    else:
        args = [str(train), str(test), "-l", "0", "-r", "2", "--rel-col", "1"]
        if cell.weighted:
            args += ["--weight-col", "3"]
        original.cli("import_from_tsv", import_config, args, workdir=root / "run", tag="_import")
    init = None
    if cell.init_path:
        original.cli("train", cell.config(root, checkpoint="seed_checkpoint", num_epochs=1), [],
                     workdir=root / "run", tag="_seed")
        init = root / "seed_checkpoint"
    config = cell.config(root, init=init)
    original.cli("train", config, [], workdir=root / "run")
    return config, write_json(root / "config.json", config)


@pytest.fixture(scope="module", params=CELLS, ids=[c.name for c in CELLS])
def theirs_run(request: pytest.FixtureRequest, original: Original,
               tmp_path_factory: pytest.TempPathFactory) -> CellRun:
    cell: Cell = request.param
    root = tmp_path_factory.mktemp(f"t2o_{cell.name}")
    config, config_path = prepare_theirs(cell, root, original)
    version = CheckpointDir(root / "checkpoint").read_version()
    assert version == cell.epochs * cell.num_chunks, f"the original committed version {version}"
    inspect = original.inspect(config, root / "inspect",
                               edge_paths=[str(root / "edges" / "train"), str(root / "edges" / "test")],
                               chunks=cell.num_chunks)
    return CellRun(cell, root, config, config_path, version, inspect)


def test_validate_clean(theirs_run: CellRun) -> None:
    report = ours_validate(theirs_run.config_path)
    assert report.ok, validation_message(report)
    checkpoint = ours_validate(theirs_run.root / "checkpoint")
    assert checkpoint.ok, "the checkpoint directory alone: " + validation_message(checkpoint)


def test_pbgio_reads_what_the_original_reads(theirs_run: CellRun) -> None:
    root = theirs_run.root
    problems = check_partitions(theirs_run.inspect, theirs_run.config)
    problems += check_model(theirs_run.inspect, theirs_run.config)
    problems += check_buckets_and_entities(
        theirs_run.inspect, theirs_run.config, [str(root / "edges" / "train"), str(root / "edges" / "test")],
        theirs_run.cell.num_chunks)
    assert not problems, failures_text(problems)


def compare_exports(original: Original, config: dict[str, Any], config_path: Path, out: Path) -> list[str]:
    """``pbgio export`` (TSV, global embeddings added) against ``torchbiggraph_export_to_tsv``."""
    out.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    original.cli("export_to_tsv", config, ["--entities-output", str(out / "theirs_entities.tsv"),
                                           "--relation-types-output", str(out / "theirs_relations.tsv")],
                 workdir=out)
    export_embeddings(config_path, out / "ours_entities.tsv")
    export_relations(config_path, out / "ours_relations.tsv")

    theirs_lines = (out / "theirs_entities.tsv").read_text().splitlines()
    ours_lines = (out / "ours_entities.tsv").read_text().splitlines()
    theirs_names = [line.split("\t", 1)[0] for line in theirs_lines]
    ours_names = [line.split("\t", 1)[0] for line in ours_lines]
    if theirs_names != ours_names:
        first = next((i for i, (a, b) in enumerate(zip(ours_names, theirs_names, strict=False)) if a != b), None)
        problems.append(f"entity rows differ in names or order: {len(ours_names)} rows (pbgio) vs "
                        f"{len(theirs_names)} (original); first difference at row {first}")
    theirs = read_export_tsv(out / "theirs_entities.tsv", as_float32=False)
    ours = read_export_tsv(out / "ours_entities.tsv", as_float32=True)
    worst, worst_name = 0.0, None
    for name in set(theirs) & set(ours):
        if theirs[name].shape != ours[name].shape:
            problems.append(f"entity {name!r}: {ours[name].shape} values (pbgio) vs {theirs[name].shape} (original)")
            continue
        diff = float(np.max(np.abs(theirs[name] - ours[name]), initial=0.0))
        if diff > worst:
            worst, worst_name = diff, name
    if worst > EXPORT_ATOL:
        problems.append(f"entity vectors differ by up to {worst:.3g} (entity {worst_name!r}; "
                        f"pbgio {ours[worst_name][:4]}…, original {theirs[worst_name][:4]}…)")

    theirs_rel = read_relations_tsv(out / "theirs_relations.tsv", as_float32=False)
    ours_rel = read_relations_tsv(out / "ours_relations.tsv", as_float32=True)
    if sorted(theirs_rel) != sorted(ours_rel):
        problems.append(f"relation parameter records differ: pbgio {sorted(ours_rel)}, original {sorted(theirs_rel)}")
    for key in sorted(set(theirs_rel) & set(ours_rel)):
        (t_shape, t_vals), (o_shape, o_vals) = theirs_rel[key], ours_rel[key]
        if t_shape != o_shape or t_vals.shape != o_vals.shape:
            problems.append(f"relation {key}: shape {o_shape} (pbgio) vs {t_shape} (original)")
        elif float(np.max(np.abs(t_vals - o_vals), initial=0.0)) > EXPORT_ATOL:
            problems.append(f"relation {key}: values differ by up to {np.max(np.abs(t_vals - o_vals)):.3g}")
    return problems


def test_exports_match_on_the_original_checkpoint(theirs_run: CellRun, original: Original, tmp_path: Path) -> None:
    problems = compare_exports(original, theirs_run.config, theirs_run.config_path, tmp_path / "export")
    assert not problems, failures_text(problems)


def test_ours_resumes_then_exports_match(theirs_run: CellRun, original: Original, tmp_path: Path) -> None:
    root = tmp_path / "resumed"
    copy_tree(theirs_run.root, root)
    config = rebase_config(theirs_run.config, theirs_run.root, root)
    config_path = write_json(root / "config.json", config)
    chunks = theirs_run.cell.num_chunks
    ours_fit(config_path, [f"num_epochs={theirs_run.cell.epochs + 1}"])
    assert CheckpointDir(root / "checkpoint").read_version() == theirs_run.version + chunks
    report = ours_validate(config_path)
    assert report.ok, "after pbgtrain resumed the original's checkpoint: " + validation_message(report)
    problems = compare_exports(original, config, config_path, tmp_path / "export")
    assert not problems, failures_text(problems)


def test_ours_warm_starts_from_original_checkpoint(original: Original, tmp_path: Path) -> None:
    """init_path across implementations: pbgtrain starts a fresh run from the original's checkpoint.
    Over an edge path of empty buckets nothing moves, so the version it commits must hold the
    original's embeddings and model parameters bit for bit."""
    cell = next(c for c in CELLS if c.init_path)
    root = tmp_path / "cell"
    config, _ = prepare_theirs(cell, root, original)
    empty = write_empty_edges(root / "edges" / "empty", config)
    fresh = write_json(root / "fresh.json", cell.config(root, checkpoint="ours_from_theirs", init=root / "checkpoint",
                                                        num_epochs=1, eval_fraction=0.0, edge_paths=[str(empty)]))
    ours_fit(fresh)
    problems = check_carried_over(root / "checkpoint", root / "ours_from_theirs", config)
    assert not problems, failures_text(problems)
