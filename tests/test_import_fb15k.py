"""FB15k-237 (train/valid/test into three edge paths sharing one dictionary) imports to a valid layout.

Uses ../shared/datasets/fb15k-237.tar.gz and skips when it is absent (tests/shared.py).
"""

from __future__ import annotations

import json
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from pbgio.entities import read_dynamic_rel_count, read_entity_count
from pbgio.importers import import_edge_lists
from pbgio.testing.edgelists import layout_edges
from pbgio.validate import validate_path
from tests.shared import shared_path

SPLITS = ("train", "valid", "test")


@pytest.mark.slow
def test_fb15k237_imports_and_validates(tmp_path: Path) -> None:
    with tarfile.open(shared_path("datasets", "fb15k-237.tar.gz")) as tar:
        tar.extractall(tmp_path, filter="data")
    [data] = [p for p in tmp_path.iterdir() if (p / "train.tsv").is_file()]
    stats = json.loads((data / "stats.json").read_text())
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "entities": {"all": {"num_partitions": 1}},
        "relations": [{"name": "all_edges", "lhs": "all", "rhs": "all", "operator": "complex_diagonal"}],
        "dynamic_relations": True, "global_emb": False, "dimension": 400, "comparator": "dot",
        "loss_fn": "softmax", "lr": 0.1, "num_uniform_negs": 1000,
        "entity_path": "layout", "edge_paths": [f"layout/{s}" for s in SPLITS], "checkpoint_path": "model"}))
    report = import_edge_lists(config, [data / f"{s}.tsv" for s in SPLITS])
    assert validate_path(config).ok
    assert [f.kept for f in report.files] == [stats[f"n_{s}"] for s in SPLITS]
    assert read_entity_count(tmp_path / "layout", "all", 0) == stats["n_entities"]
    assert read_dynamic_rel_count(tmp_path / "layout") == stats["n_relations"]
    edges = layout_edges(config)
    for split in SPLITS:
        rows = [tuple(line.split("\t")) for line in (data / f"{split}.tsv").read_text().splitlines()]
        assert Counter(e[:3] for e in edges[f"layout/{split}"]) == Counter(rows)
