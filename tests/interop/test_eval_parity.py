"""Evaluation parity: ``pbgtrain eval --all-entities`` and the original's evaluation with every
entity as a candidate report the same MRR, MR and Hits@1/10/50 on the same checkpoint.

The original side runs ``torchbiggraph_eval``'s code path (``ConfigFileLoader`` with ``-p``
overrides, then ``eval.do_eval_and_report_stats``) through the driver, which returns the
final stats at full precision instead of its ``%.6g`` log line. Overrides:
``edge_paths=<test>``, ``relations.<i>.all_negs=true`` for every relation (candidates: all
entities of the partition, the positive itself masked to -1e9) and ``num_uniform_negs=0``
(the original warns that uniform negatives make no sense with ``all_negs``).

Both rank as ``1 + #(candidates scoring >= the positive)`` and average each metric over the
edges and over the two sides; ``count`` is the number of test edges. The original sums ranks
per batch in float32, so MRR and MR agree to float rounding; Hits@k are counts and agree
exactly unless a score tie falls differently under the two implementations' rounding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from interop_cells import CELLS_BY_NAME, Cell
from interop_harness import Original, config_py_text, ours_fit, ours_import, write_json

from pbgtrain.config import load_run_config
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint

pytestmark = pytest.mark.interop

REL_TOL = 1e-5


@pytest.mark.parametrize("cell_name", ["static_unpart", "dynamic"])
def test_all_entities_metrics_match(cell_name: str, original: Original, tmp_path: Path) -> None:
    cell: Cell = CELLS_BY_NAME[cell_name]
    root = tmp_path / cell.name
    train, test = cell.write_inputs(root)
    ours_import(write_json(root / "import.json", cell.config(root, edge_paths=("train", "test"))), [train, test])
    config = cell.config(root)
    config_path = write_json(root / "config.json", config)
    ours_fit(config_path)
    test_dir = root / "edges" / "test"

    ours = evaluate_checkpoint(load_run_config(config_path), EvalOptions(edge_paths=[test_dir], all_entities=True))
    m = ours.metrics

    cfg_py = root / "eval_config.py"
    cfg_py.write_text(config_py_text(config))
    overrides = [f"edge_paths={test_dir}", "num_uniform_negs=0"]
    overrides += [f"relations.{i}.all_negs=true" for i in range(len(config["relations"]))]
    args = ["--config-py", str(cfg_py)]
    for override in overrides:
        args += ["-p", override]
    theirs = original.driver("eval", args, workdir=root / "eval")
    final = theirs["final"]
    assert all(r["all_negs"] for r in theirs["relations"]), theirs["relations"]

    values = {"count": (m.count, final["count"]), "mrr": (m.mrr, final["metrics"]["mrr"]),
              "MR (pos_rank)": (m.mr, final["metrics"]["pos_rank"]),
              **{f"Hits@{k} (r{k})": (m.hits[k], final["metrics"][f"r{k}"]) for k in (1, 10, 50)}}
    table = "\n".join(f"  {k:14s} pbgtrain {a!r:24} original {b!r}" for k, (a, b) in values.items())
    mismatched = [k for k, (a, b) in values.items() if abs(a - b) > REL_TOL * max(1.0, abs(b))]
    assert not mismatched, f"{cell.name}: {', '.join(mismatched)} differ ({m.protocol}):\n{table}"
