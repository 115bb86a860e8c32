"""Tiny end-to-end runs on real benchmarks: import → fit → filtered eval reaches a stated MRR.

Uses ../shared/datasets (umls, nations); skips when the archives are absent (tests/shared.py). The
thresholds sit below what these runs measured here (umls: filtered MRR 0.837, where the
original reached 0.825 at dimension 100 and 20 epochs; nations: 0.626), far above chance
(about 0.04 for umls' 135 entities), so a broken trainer fails them.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from pbgio.importers import import_edge_lists
from pbgtrain.config import load_run_config
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
from pbgtrain.train import FitOptions, fit
from tests.shared import shared_path

SPLITS = ("train", "valid", "test")


def _layout(tmp_path: Path, name: str, **config: object) -> Path:
    archive = shared_path("datasets", f"{name}.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "raw", filter="data")
    [train] = list((tmp_path / "raw").rglob("train.tsv"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "entities": {"all": {"num_partitions": 1}},
        "relations": [{"name": "all_edges", "lhs": "all", "rhs": "all", "operator": "complex_diagonal"}],
        "dynamic_relations": True, "global_emb": False, "comparator": "dot", "loss_fn": "softmax",
        "lr": 0.1, "regularization_coef": 1e-3, "batch_size": 500, "num_batch_negs": 50, "num_uniform_negs": 100,
        "eval_fraction": 0, "entity_path": "layout", "edge_paths": [f"layout/{s}" for s in SPLITS],
        "checkpoint_path": "model", **config}))
    import_edge_lists(path, [train.parent / f"{s}.tsv" for s in SPLITS])
    return path


@pytest.mark.slow  # imports and trains a real benchmark: about 10 s each
@pytest.mark.parametrize(("name", "dimension", "epochs", "threshold"), [
    ("umls", 100, 20, 0.75),
    ("nations", 50, 30, 0.55),
])
def test_dataset_reaches_stated_filtered_mrr(tmp_path: Path, name: str, dimension: int, epochs: int,
                                             threshold: float) -> None:
    config = _layout(tmp_path, name, dimension=dimension)
    layout = tmp_path / "layout"
    run = load_run_config(config, [f"num_epochs={epochs}", "edge_paths=layout/train"])
    fit(run, FitOptions(seed=0))
    result = evaluate_checkpoint(run, EvalOptions(edge_paths=[layout / "test"],
                                                  filter_paths=[layout / s for s in SPLITS]))
    print(name, result.metrics)
    assert result.metrics.protocol.filtered
    assert result.metrics.mrr >= threshold, str(result.metrics)
