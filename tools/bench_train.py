"""Benchmark ``pbgtrain`` on FB15k-237 against the original's figures on this machine.

The configuration is the one measured with the original (../shared/datasets/README.md):
one entity type, one partition, dynamic relations, ComplEx (complex_diagonal), dimension 400,
dot comparator, softmax loss, lr 0.1, N3 regularization 1e-3, batch 1000, 50 batch + 1000
uniform negatives, 6 epochs. The original: 62.6 s per epoch (4.35k edges/s), peak 1.4 GiB over
4 processes, filtered test MRR 0.2832 / Hits@1 0.187 / Hits@10 0.477 (all entities as
candidates, filter = train+valid+test, both sides averaged).

Steps: unpack the dataset into ``bench-data/`` (once), import train/valid/test with
``pbgio.importers`` into three edge paths sharing one dictionary, then, in a child process
(for an exact peak RSS), train epoch by epoch, timing each, and evaluate the test split with
the filtered protocol (every N epochs with ``--eval-every N``, and after the last).
``--minutes M`` trains until M minutes of training have passed (more epochs) and reports the
best MRR reached.

    .venv/bin/python tools/bench_train.py                 # 6 epochs, the reference protocol
    .venv/bin/python tools/bench_train.py --minutes 30 --eval-every 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _benchutil import CHILD_PROLOGUE, REPO_ROOT, ChildRun, environment, format_table, run_python, write_json

ARCHIVE = REPO_ROOT.parent / "shared" / "datasets" / "fb15k-237.tar.gz"
ORIGINAL_EDGES_PER_S = 4_350
ORIGINAL_EPOCH_S = 62.6
ORIGINAL_MRR = 0.2832
ORIGINAL_HITS1 = 0.187
ORIGINAL_HITS10 = 0.477
SPLITS = ("train", "valid", "test")

CONFIG = {
    "entities": {"all": {"num_partitions": 1}},
    "relations": [{"name": "all_edges", "lhs": "all", "rhs": "all", "operator": "complex_diagonal"}],
    "dynamic_relations": True,
    "global_emb": False,
    "dimension": 400,
    "comparator": "dot",
    "loss_fn": "softmax",
    "lr": 0.1,
    "regularization_coef": 1e-3,
    "regularizer": "N3",
    "batch_size": 1000,
    "num_batch_negs": 50,
    "num_uniform_negs": 1000,
    "eval_fraction": 0.0,
    "num_epochs": 6,
    "entity_path": "layout",
    "edge_paths": ["layout/train"],
    "checkpoint_path": "model",
}

CHILD = CHILD_PROLOGUE + r"""
import json, sys
from pathlib import Path
from pbgtrain.config import load_run_config
from pbgtrain.train import FitOptions, fit
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint

args = json.loads(sys.argv[1])
root = Path(args["root"])
overrides = [f"num_epochs={args['epochs']}"] + args["overrides"]
run = load_run_config(root / "config.json", overrides)
layout = root / "layout"
eval_options = EvalOptions(edge_paths=[layout / "test"], filter_paths=[layout / s for s in ("train", "valid", "test")],
                           device=args["device"])
epochs, evals = [], []
train_seconds = 0.0
first = True
while True:
    result = fit(run, FitOptions(seed=args["seed"], check_layout=first, max_iterations=1, device=args["device"],
                                 precision=args["precision"]))
    first = False
    if not result.iterations:
        break
    record = result.iterations[-1]
    train_seconds += record.seconds
    epochs.append({"epoch": record.step.epoch_idx + 1, "seconds": record.seconds, "edges": record.train.count,
                   "edges_per_s": record.edges_per_second,
                   "loss": record.train.loss / max(record.train.count, 1)})
    print(f"epoch {record.step.epoch_idx + 1}: {record.seconds:.1f} s, {record.edges_per_second:,.0f} edges/s, "
          f"loss {epochs[-1]['loss']:.4f}", flush=True)
    last = not result.stopped_early
    out_of_time = args["minutes"] is not None and train_seconds > args["minutes"] * 60
    every = args["eval_every"]
    if (every and (record.step.epoch_idx + 1) % every == 0) or last or out_of_time:
        ev = evaluate_checkpoint(run, eval_options)
        m = ev.metrics
        evals.append({"epoch": record.step.epoch_idx + 1, "train_seconds": train_seconds, "mrr": m.mrr,
                      "hits1": m.hits[1], "hits10": m.hits[10], "mr": m.mr, "seconds": ev.seconds,
                      "protocol": m.protocol.describe(), "count": m.count})
        print(f"  test after epoch {record.step.epoch_idx + 1}: {m}  [eval {ev.seconds:.1f} s]", flush=True)
    if last or out_of_time:
        break
emit(epochs=epochs, evals=evals, train_seconds=train_seconds)
"""


def prepare(root: Path, seed: int) -> Path:
    """Unpacked dataset and imported layout under ``root`` (reused when present)."""
    data = root / "data"
    if not (data / "train.tsv").is_file():
        if not ARCHIVE.is_file():
            sys.exit(f"skipped: {ARCHIVE} is absent")
        data.mkdir(parents=True, exist_ok=True)
        with tarfile.open(ARCHIVE) as tar:
            tar.extractall(root / "unpacked", filter="data")
        [found] = [p for p in (root / "unpacked").rglob("train.tsv")]
        for split in SPLITS:
            shutil.copy(found.parent / f"{split}.tsv", data / f"{split}.tsv")
    config = dict(CONFIG, edge_paths=[f"layout/{s}" for s in SPLITS])
    config_path = root / "config.json"
    if not (root / "layout" / "dynamic_rel_count.txt").is_file():
        from pbgio.importers import import_edge_lists

        import_config = root / "import-config.json"
        import_config.write_text(json.dumps(config), encoding="utf-8")
        import_edge_lists(import_config, [data / f"{s}.tsv" for s in SPLITS], seed=seed, overwrite=True)
    config_path.write_text(json.dumps(CONFIG, indent=4), encoding="utf-8")
    return config_path


def train_and_evaluate(root: Path, *, epochs: int = 6, minutes: float | None = None, eval_every: int = 0,
                       seed: int = 0, overrides: list[str] | None = None, device: str | None = None,
                       precision: str | None = None) -> ChildRun:
    """Import (once), train from scratch in a child process and evaluate; the child's run
    (``result``: epochs, evals, train_seconds)."""
    prepare(root, seed)
    shutil.rmtree(root / "model", ignore_errors=True)
    run = run_python(CHILD, {"root": str(root), "epochs": 10_000 if minutes is not None else epochs,
                             "minutes": minutes, "eval_every": eval_every, "seed": seed,
                             "overrides": overrides or [], "device": device, "precision": precision})
    if run.result is None:
        sys.exit(f"training failed (exit {run.returncode}): {run.failure()}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--root", type=Path, default=REPO_ROOT / "bench-data" / "train-fb15k237")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--minutes", type=float, default=None,
                        help="train for this many minutes (more epochs) and report the best test MRR")
    parser.add_argument("--eval-every", type=int, default=0, metavar="N",
                        help="evaluate the test split every N epochs (and after the last)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu, cuda … (default: the config's)")
    parser.add_argument("--precision", default=None, choices=["fp32", "tf32", "bf16"], help="default: fp32")
    parser.add_argument("-p", "--param", action="append", default=[], help="config override key=value")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    run = train_and_evaluate(args.root, epochs=args.epochs, minutes=args.minutes, eval_every=args.eval_every,
                             seed=args.seed, overrides=args.param, device=args.device, precision=args.precision)
    result = run.result
    rows = [[str(e["epoch"]), f"{e['seconds']:.1f}", f"{e['edges_per_s']:,.0f}",
             f"{e['edges_per_s'] / ORIGINAL_EDGES_PER_S:.2f}x", f"{e['loss']:.4f}"] for e in result["epochs"]]
    print(format_table(["epoch", "seconds", "edges/s", "x original (4.35k)", "loss"], rows))
    steady = result["epochs"][1:] or result["epochs"]
    mean_rate = sum(e["edges"] for e in steady) / sum(e["seconds"] for e in steady)
    print(f"mean edges/s (epochs 2+): {mean_rate:,.0f} = {mean_rate / ORIGINAL_EDGES_PER_S:.2f}x the original's "
          f"{ORIGINAL_EDGES_PER_S:,}; peak RSS {run.peak_rss_bytes / 2**30:.2f} GiB (original: 1.4 GiB)")
    best = max(result["evals"], key=lambda e: e["mrr"]) if result["evals"] else None
    for ev in result["evals"]:
        print(f"test after epoch {ev['epoch']} ({ev['train_seconds'] / 60:.1f} min of training): MRR {ev['mrr']:.4f} "
              f"Hits@1 {ev['hits1']:.4f} Hits@10 {ev['hits10']:.4f} MR {ev['mr']:.1f} [{ev['protocol']}; "
              f"{ev['count']:,} edges; eval {ev['seconds']:.1f} s]")
    if best is not None:
        print(f"best MRR {best['mrr']:.4f} after epoch {best['epoch']} (original after 6 epochs: {ORIGINAL_MRR}, "
              f"Hits@1 {ORIGINAL_HITS1}, Hits@10 {ORIGINAL_HITS10})")
    if args.json:
        write_json(args.json, {"environment": environment(), "mean_edges_per_s": mean_rate,
                               "peak_rss_bytes": run.peak_rss_bytes, **result})


if __name__ == "__main__":
    main()
