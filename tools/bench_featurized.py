"""Benchmark featurized training against plain training of a graph of the same size.

Both graphs have the same edges, the same plain ``author`` type on the left and a ``doc``
type on the right with the same number of table rows; in the plain graph each edge's doc is
one row, in the featurized graph it is a bag of 1 to ``2·k−1`` feature rows (mean ``k``).
Both train with the same config: same dimension, batch, operator, comparator, loss and
``num_batch_negs`` same-batch negatives; ``num_uniform_negs`` is 0 for both (featurized types
allow no other negatives: docs/guides/featurized.md). A third run, ``plain+uniform``, adds the default 50
uniform negatives to the plain graph for reference. Each run trains in a child process (exact
peak RSS); edges/s is the mean over epochs 2+ (epoch 1 warms up).

    .venv/bin/python tools/bench_featurized.py                    # 1M edges, 3 epochs
    .venv/bin/python tools/bench_featurized.py --edges 200000 --epochs 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _benchutil import CHILD_PROLOGUE, REPO_ROOT, environment, format_table, run_python, write_json

CHILD = CHILD_PROLOGUE + r"""
import json
from pathlib import Path
from pbgtrain.config import load_run_config
from pbgtrain.train import FitOptions, fit

root = Path(ARGS["root"])
run = load_run_config(root / "config.json", ARGS["overrides"])
epochs = []
while True:
    result = fit(run, FitOptions(seed=0, check_layout=False, max_iterations=1))
    if not result.iterations:
        break
    record = result.iterations[-1]
    epochs.append({"seconds": record.seconds, "edges": record.train.count, "edges_per_s": record.edges_per_second})
    print(f"  epoch {len(epochs)}: {record.seconds:.2f} s, {record.edges_per_second:,.0f} edges/s", flush=True)
    if not result.stopped_early:
        break
emit(epochs=epochs)
"""


def build(root: Path, *, featurized: bool, num_edges: int, num_authors: int, num_doc_rows: int,
          mean_bag: int, dimension: int, seed: int) -> None:
    """Write the layout and config of one graph under ``root``."""
    import numpy as np

    from pbgio.edges import EdgeBucket, FeatureLists, write_bucket
    from pbgio.entities import write_entity_count
    from pbgio.spec import naming

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    write_entity_count(root / "entities", "author", 0, num_authors)
    write_entity_count(root / "entities", "doc", 0, num_doc_rows)
    lhs = rng.integers(0, num_authors, num_edges)
    rel = np.zeros(num_edges, dtype=np.int64)
    if featurized:
        lengths = rng.integers(1, 2 * mean_bag, num_edges)
        offsets = np.zeros(num_edges + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = rng.integers(0, num_doc_rows, int(offsets[-1]))
        bucket = EdgeBucket(rel, lhs, np.full(num_edges, -1), rhs_features=FeatureLists(offsets, data))
    else:
        bucket = EdgeBucket(rel, lhs, rng.integers(0, num_doc_rows, num_edges))
    write_bucket(root / "edges" / naming.bucket_file(0, 0), bucket)
    config = {
        "entities": {"author": {"num_partitions": 1}, "doc": {"num_partitions": 1, "featurized": featurized}},
        "relations": [{"name": "reads", "lhs": "author", "rhs": "doc", "operator": "diagonal"}],
        "dimension": dimension, "comparator": "dot", "loss_fn": "softmax", "lr": 0.1,
        "batch_size": 1000, "num_batch_negs": 50, "num_uniform_negs": 0, "eval_fraction": 0.0,
        "entity_path": "entities", "edge_paths": ["edges"], "checkpoint_path": "model",
    }
    (root / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--root", type=Path, default=REPO_ROOT / "bench-data" / "featurized")
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--authors", type=int, default=20_000)
    parser.add_argument("--doc-rows", type=int, default=50_000, help="docs (plain) or features (featurized)")
    parser.add_argument("--mean-bag", type=int, default=5, help="mean features per featurized doc")
    parser.add_argument("--dimension", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO_ROOT))
    runs = {"plain": (False, []), "featurized": (True, []), "plain+uniform": (False, ["num_uniform_negs=50"])}
    results = {}
    for name, (featurized, overrides) in runs.items():
        root = args.root / ("featurized" if featurized else "plain")
        stamp = root / "graph.json"
        if not stamp.is_file() or json.loads(stamp.read_text()) != vars_key(args):
            shutil.rmtree(root, ignore_errors=True)
            build(root, featurized=featurized, num_edges=args.edges, num_authors=args.authors,
                  num_doc_rows=args.doc_rows, mean_bag=args.mean_bag, dimension=args.dimension, seed=args.seed)
            stamp.write_text(json.dumps(vars_key(args)), encoding="utf-8")
        shutil.rmtree(root / "model", ignore_errors=True)
        print(f"{name}:", flush=True)
        run = run_python(CHILD, {"root": str(root), "overrides": [f"num_epochs={args.epochs}", *overrides]})
        if not run.ok:
            sys.exit(run.failure())
        print("\n".join(line for line in run.stdout.splitlines() if line.startswith("  epoch")), flush=True)
        epochs = run.result["epochs"]
        steady = epochs[1:] or epochs
        rate = sum(e["edges"] for e in steady) / sum(e["seconds"] for e in steady)
        results[name] = {"edges_per_s": rate, "peak_rss_bytes": run.peak_rss_bytes, "epochs": epochs}
    base = results["plain"]["edges_per_s"]
    rows = [[name, f"{r['edges_per_s']:,.0f}", f"{r['edges_per_s'] / base:.2f}x",
             f"{r['peak_rss_bytes'] / 2**20:,.0f}"] for name, r in results.items()]
    print(f"{args.edges:,} edges, {args.authors:,} authors, {args.doc_rows:,} doc rows, dimension {args.dimension}, "
          f"featurized bags of mean {args.mean_bag} features; batch 1000, 50 same-batch negatives")
    print(format_table(["run", "edges/s (epochs 2+)", "vs plain", "peak RSS MiB"], rows))
    if args.json:
        write_json(args.json, {"environment": environment(), "args": vars_key(args), **results})


def vars_key(args: argparse.Namespace) -> dict[str, int]:
    """The arguments that shape the graphs (a changed one rebuilds them)."""
    return {k: getattr(args, k) for k in ("edges", "authors", "doc_rows", "mean_bag", "dimension", "seed")}


if __name__ == "__main__":
    main()
