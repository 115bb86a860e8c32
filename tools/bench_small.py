"""Edges/s of whole ``pbgtrain fit`` runs on the small graphs that per-batch overhead dominates, for this
checkout and (``--baseline ROOT``) another one, side by side in the same session.

Graphs (``--graph``, repeatable; default both):

- ``example``: the bundled example (``pbgio example``: 2 partitions, two static relations with
  translation and diagonal operators, global embeddings, d16, batch 100, 50 + 50 negatives);
- ``kinship``: ``recipes/kinship.json`` on ../shared/datasets/kinship (dynamic relations,
  ComplEx d200, 1-vs-all over 104 entities, N3, batch 100) with the recipe's ``--precision bf16``.

Each run is a fresh child process that imports the checkout under test (``PYTHONPATH``), trains
``--epochs`` epochs from scratch without validation, and reports each iteration's edges/s (the
iteration's edges over its wall time, its commit included). Printed: the median over the
iterations after the first, for each checkout, and the ratio; and the whole run's: every edge
trained over the wall time of the ``fit`` call (building the model and opening the layout
included, importing Python modules before it not), the median over the rounds. Runs alternate between the
checkouts ``--rounds`` times so that a busy moment of the machine hits both. A baseline is any
checkout of pbg, e.g. ``git worktree add /tmp/before <commit>``.

    .venv/bin/python tools/bench_small.py --baseline /tmp/before
    .venv/bin/python tools/bench_small.py --graph example --epochs 20
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _benchutil import CHILD_PROLOGUE, REPO_ROOT, environment, format_table, run_python, write_json

CHILD = CHILD_PROLOGUE + r"""
import pbgtrain
from pathlib import Path
from pbgtrain.config import load_run_config
from pbgtrain.train import FitOptions, fit

import time
run = load_run_config(Path(ARGS["config"]), ARGS["overrides"])
started = time.perf_counter()
result = fit(run, FitOptions(check_layout=False, precision=ARGS["precision"]))
seconds = time.perf_counter() - started
emit(code=pbgtrain.__file__, rates=[r.train.count / r.seconds for r in result.iterations],
     run_rate=sum(r.train.count for r in result.iterations) / seconds)
"""


def example_config(work: Path) -> Path:
    config = work / "example" / "config.json"
    if not config.is_file():
        from pbgio.example import build_example

        build_example(config.parent)
    return config


def kinship_config(work: Path) -> Path:
    from bench_quality import prepare  # the recipe's config and its imported layout, as the quality benchmark has them

    return prepare(work, "kinship") / "config.json"


GRAPHS: dict[str, Any] = {
    "example": (example_config, [], None),
    "kinship": (kinship_config, ["edge_paths=data/train"], "bf16"),
}


def run(root: Path, config: Path, overrides: list[str], precision: str | None,
        epochs: int) -> tuple[list[float], float]:
    """Each iteration's edges/s and the whole fit's, of one run with the checkout ``root``."""
    shutil.rmtree(config.parent / "checkpoint", ignore_errors=True)
    shutil.rmtree(config.parent / "model", ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(root)}
    child = run_python(CHILD, {"config": str(config), "overrides": [*overrides, f"num_epochs={epochs}"],
                               "precision": precision}, cwd=root, env=env)
    if not child.ok:
        sys.exit(f"training with {root} failed: {child.failure()}")
    if not child.result["code"].startswith(str(root)):
        sys.exit(f"the child imported {child.result['code']}, not the checkout {root}")
    return list(child.result["rates"]), float(child.result["run_rate"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="append", choices=sorted(GRAPHS), default=None)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout of pbg to compare with")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--root", type=Path, default=REPO_ROOT / "bench-data" / "small")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    roots = {"this": REPO_ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    rows, figures = [], {"environment": environment(), "graphs": {}}
    for name in args.graph or sorted(GRAPHS):
        make, overrides, precision = GRAPHS[name]
        config = make(args.root)
        rates: dict[str, list[float]] = {label: [] for label in roots}
        run_rates: dict[str, list[float]] = {label: [] for label in roots}
        for _ in range(args.rounds):
            for label, root in roots.items():
                iterations, whole = run(root, config, overrides, precision, args.epochs)
                rates[label] += iterations[1:]
                run_rates[label].append(whole)
        for measure, values in (("iteration", rates), ("whole run", run_rates)):
            medians = {label: statistics.median(v) for label, v in values.items()}
            ratio = f"{medians['this'] / medians['baseline']:.2f}x" if "baseline" in medians else "-"
            rows.append([name, measure, f"{medians['this']:,.0f}",
                         f"{medians['baseline']:,.0f}" if "baseline" in medians else "-", ratio])
        figures["graphs"][name] = {"median_edges_per_s": {label: statistics.median(v) for label, v in rates.items()},
                                   "iterations": rates, "whole_run_edges_per_s": run_rates}
    print(format_table(["graph", "edges/s of", "this", "baseline", "ratio"], rows))
    if args.json:
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
