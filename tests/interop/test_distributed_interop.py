"""Distributed ours → theirs: a checkpoint committed by two pbgtrain trainers (real processes, gloo
on localhost, ``tests/distributed_runs.py``) is read by the original as pbgio reads it, and both
the original and single-process pbgtrain resume it.

The graph is planted (:mod:`pbgio.testing.planted`): one type ``node`` in 4 partitions, 400
nodes, 8000 edges in 2 chunks, 2 epochs, so the trainers commit version 4. The checkpoint's
``config.json`` records the launch (``num_machines=2``, the ``tcp://`` init method); the
original is handed the same layout with ``num_machines=1`` and no init method, as a user moving
the run to one machine would (else it would start its own distributed mode and wait for peers).

* the checkpoint passes ``pbgio validate``, and both ranks trained buckets of it;
* the original's ``ConfigSchema`` accepts the checkpoint's ``config.json`` as written;
* ``CheckpointManager.read`` gives every partition bit for bit as pbgio reads it; the model
  loads (no missing/unexpected key) with the same values; both optimizers load and step; every
  stats line parses;
* ``torchbiggraph_train`` resumes at version 4 and commits 5 and 6 (one more epoch); then
  ``pbgio validate`` is clean;
* ``pbgtrain fit`` (one process) resumes at version 4 and ends at 6; validate is clean.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from interop_checks import (
    bits,
    check_buckets_and_entities,
    check_embedding_optimizers,
    check_model,
    check_model_optimizer,
    check_partitions,
    check_stats,
)
from interop_harness import Original, copy_tree, failures_text, ours_fit, ours_validate, validation_message

from pbgio.checkpoint import CheckpointDir
from pbgio.config import parse_config
from pbgio.testing.planted import TEST_EDGE_PATH, planted_graph
from pbgtrain.model import EmbeddingModel

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
from distributed_runs import run_trainers  # noqa: E402

pytestmark = pytest.mark.interop

WORLD = 2
EPOCHS = 2
CHUNKS = 2
VERSION = EPOCHS * CHUNKS


@dataclass(frozen=True)
class DistributedRun:
    graph: Path  # the planted layout; its config.json has relative paths
    raw: dict[str, Any]  # that config.json
    config: dict[str, Any]  # the original's view of it: absolute paths, one machine
    inspect: dict[str, Any]


def for_original(raw: dict[str, Any], base: Path, **overrides: Any) -> dict[str, Any]:
    """``raw`` with its paths made absolute under ``base`` (the original resolves them against the
    working directory), on one machine: no ``distributed_init_method``."""
    out = dict(raw)
    out["entity_path"] = str(base / raw["entity_path"])
    out["checkpoint_path"] = str(base / raw["checkpoint_path"])
    out["edge_paths"] = [str(base / p) for p in raw["edge_paths"]]
    out.update(num_machines=1, distributed_init_method=None, workers=1)
    out.update(overrides)
    return out


@pytest.fixture(scope="module")
def dist_run(original: Original, tmp_path_factory: pytest.TempPathFactory) -> DistributedRun:
    root = tmp_path_factory.mktemp("dist_o2t")
    config_path = planted_graph(root / "graph", num_partitions=4, num_nodes=400, num_edges=8000,
                                num_edge_chunks=CHUNKS, num_epochs=EPOCHS, workers=1)
    graph = config_path.parent
    run_trainers(config_path, WORLD)
    assert CheckpointDir(graph / "checkpoint").read_version() == VERSION
    raw = json.loads(config_path.read_text())
    config = for_original(raw, graph)
    inspect = original.inspect(config, root / "inspect",
                               edge_paths=[str(graph / "edges" / "train"), str(graph / TEST_EDGE_PATH)],
                               chunks=CHUNKS, extra_configs=[graph / "checkpoint" / "config.json"])
    return DistributedRun(graph, raw, config, inspect)


def test_distributed_checkpoint_is_valid_and_trained_by_both_ranks(dist_run: DistributedRun) -> None:
    report = ours_validate(dist_run.graph)
    assert report.ok, validation_message(report)
    ckpt = CheckpointDir(dist_run.graph / "checkpoint")
    assert ckpt.versions_on_disk() == [VERSION]
    written = json.loads((dist_run.graph / "checkpoint" / "config.json").read_text())
    assert written["num_machines"] == WORLD and written["distributed_init_method"].startswith("tcp://127.0.0.1:")
    ranks = {line["pbgtrain"]["rank"] for line in ckpt.read_stats() if "lhs_partition" in line}
    assert ranks == set(range(WORLD)), f"only rank(s) {ranks} trained: not a distributed checkpoint"
    assert dist_run.inspect["version"] == VERSION, "the original's CheckpointManager sees another version"


def test_checkpoint_config_json_accepted(dist_run: DistributedRun) -> None:
    path = dist_run.graph / "checkpoint" / "config.json"
    got = dist_run.inspect["extra_configs"][str(path)]
    assert got["ok"], f"ConfigSchema.from_dict refuses the distributed run's {path.name}: {got.get('error')}"
    assert got["to_dict"] == json.loads(path.read_text()), "the original would write this config.json differently"


def test_partitions_read_bit_exact(dist_run: DistributedRun) -> None:
    problems = check_partitions(dist_run.inspect, dist_run.config)
    assert not problems, failures_text(problems)


def test_model_and_optimizers_load_and_step(dist_run: DistributedRun) -> None:
    order = [name for name, _ in EmbeddingModel.from_config(parse_config(dist_run.config)).named_parameters()]
    problems = (check_model(dist_run.inspect, dist_run.config)
                + check_model_optimizer(dist_run.inspect, order)
                + check_embedding_optimizers(dist_run.inspect, dist_run.config)
                + check_stats(dist_run.inspect))
    assert not problems, failures_text(problems)


def test_buckets_and_entities_read_identically(dist_run: DistributedRun) -> None:
    graph = dist_run.graph
    problems = check_buckets_and_entities(dist_run.inspect, dist_run.config,
                                          [str(graph / "edges" / "train"), str(graph / TEST_EDGE_PATH)], CHUNKS)
    assert not problems, failures_text(problems)


def mean_row_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    dots = (a64 * b64).sum(1) / np.maximum(np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1), 1e-30)
    return float(dots.mean())


def test_original_resumes_the_distributed_checkpoint(dist_run: DistributedRun, original: Original,
                                                     tmp_path: Path) -> None:
    graph = tmp_path / "graph"
    copy_tree(dist_run.graph, graph)
    ckpt = CheckpointDir(graph / "checkpoint")
    config = for_original(dist_run.raw, graph)
    original.cli("train", config, [], workdir=tmp_path / "run", overrides=[f"num_epochs={EPOCHS + 1}"])
    assert ckpt.read_version() == VERSION + CHUNKS, \
        f"torchbiggraph_train committed version {ckpt.read_version()}, expected {VERSION + CHUNKS}"
    lines = [line for line in ckpt.read_stats() if "lhs_partition" in line]
    theirs = [line for line in lines if "pbgtrain" not in line]
    assert len(lines) == (EPOCHS + 1) * CHUNKS * 16 and {line["epoch_idx"] for line in theirs} == {EPOCHS}, \
        "the original did not train exactly the one epoch after ours"
    # It trained on from our embeddings (a fresh start would be near-orthogonal to them).
    before, after = CheckpointDir(dist_run.graph / "checkpoint"), ckpt
    for part in range(4):
        similarity = mean_row_cosine(before.read_embeddings("node", part).embeddings,
                                     after.read_embeddings("node", part).embeddings)
        assert similarity > 0.9, f"node/{part}: version {VERSION + CHUNKS} is unrelated to ours (cos {similarity:.2f})"
    report = ours_validate(graph)
    assert report.ok, "after the original resumed the distributed checkpoint: " + validation_message(report)


def test_single_process_pbgtrain_resumes_the_distributed_checkpoint(dist_run: DistributedRun, tmp_path: Path) -> None:
    graph = tmp_path / "graph"
    copy_tree(dist_run.graph, graph)
    result = ours_fit(graph / "config.json", [f"num_epochs={EPOCHS + 1}"])
    assert (result.start_version, result.final_version) == (VERSION, VERSION + CHUNKS)
    ckpt = CheckpointDir(graph / "checkpoint")
    assert ckpt.read_version() == VERSION + CHUNKS
    ranks = {line.get("pbgtrain", {}).get("rank") for line in ckpt.read_stats()
             if "lhs_partition" in line and line["epoch_idx"] == EPOCHS}
    assert len(ranks) == 1, f"the single-process run's lines name ranks {ranks}"
    before = CheckpointDir(dist_run.graph / "checkpoint").read_embeddings("node", 0).embeddings
    assert not np.array_equal(bits(before), bits(ckpt.read_embeddings("node", 0).embeddings))
    report = ours_validate(graph)
    assert report.ok, "after pbgtrain resumed the distributed checkpoint: " + validation_message(report)
