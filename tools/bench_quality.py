"""Quality per minute: filtered link-prediction MRR of the recipes in ``recipes/``, with the minutes
it took, beside the published figures and (``--pykeen``) PyKEEN on the same machine and protocol.

For each dataset of ``../shared/datasets`` asked for (default: all five), in ``--root``:

1. unpack it and import train, valid and test with the recipe's config (``recipes/NAME.json``:
   one dictionary for the three splits);
2. train on the training split only, exactly as ``recipes/README.md`` says (its table's fit
   options, read from that file: the documented command is the measured one), in a child
   process (its peak RSS is the run's), picking the model on the validation split
   (``--valid``: the best version is kept in ``model/best/``);
3. evaluate the kept version on the test split, filtered against train+valid+test, all entities
   as candidates, both sides averaged.

Printed per dataset: test MRR / Hits@1 / Hits@10 of the version picked on valid, the minutes of
training (wall clock, validation included) until that version was committed and in all, edges/s
of training, peak RSS, and the published figures for the model family.

``--pykeen`` installs PyKEEN (``--pykeen-version``, torch pinned by ``constraints/dev.txt``) into a
side venv under ``--root`` (never a dependency of pbg) and trains ComplEx of the same dimension
(``dimension / 2`` complex coordinates) on the same splits for ``--pykeen-minutes``: LCWA with
cross-entropy over all entities (1-vs-all, its best mode for quality) and sLCWA with sampled
negatives (its fast mode), evaluated on test with its filtered rank-based evaluator (both sides,
realistic ranks).

    .venv/bin/python tools/bench_quality.py                      # all five datasets
    .venv/bin/python tools/bench_quality.py fb15k-237 --pykeen   # one, with PyKEEN beside it
    .venv/bin/python tools/bench_quality.py fb15k-237 --extra '--relation-prediction 1'  # a try beside it
    .venv/bin/python tools/bench_quality.py kinship --device cuda
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _benchutil import CHILD_PROLOGUE, REPO_ROOT, format_table, run_python, write_json

DATASETS = REPO_ROOT.parent / "shared" / "datasets"
RECIPES = REPO_ROOT / "recipes"
SPLITS = ("train", "valid", "test")
PUBLISHED = {  # filtered test MRR of the ComplEx family (N3, reciprocal relations, 1-vs-all)
    "fb15k-237": "ComplEx-N3 .37 (Lacroix et al. 2018); LibKGE ComplEx .348",
    "wn18rr": "ComplEx-N3 .48 (Lacroix et al. 2018); LibKGE ComplEx .475",
}
ORIGINAL = {  # the original PyTorch-BigGraph on the development machine (../shared/datasets/README.md)
    "fb15k-237": "original .283 (d400, 6 epochs, 6.3 min)",
    "wn18rr": "original .213 (d400, 10 epochs)",
    "kinship": "original .783 (d100, 20 epochs)",
    "umls": "original .825 (d100, 20 epochs)",
}


def recipe_options(name: str) -> tuple[list[str], float]:
    """The fit options of ``name``'s row in recipes/README.md, and its --max-minutes."""
    text = (RECIPES / "README.md").read_text(encoding="utf-8")
    row = re.search(rf"^\| `{re.escape(name)}` \|.*\| `([^`]*)` \|\s*$", text, re.MULTILINE)
    if row is None:
        sys.exit(f"recipes/README.md has no row for {name}")
    options = row.group(1).split()
    minutes = float(options[options.index("--max-minutes") + 1]) if "--max-minutes" in options else float("inf")
    return options, minutes


def prepare(root: Path, name: str) -> Path:
    """``root/NAME``: the recipe's config and the imported layout (reused when present)."""
    work = root / name
    config = work / "config.json"
    if (work / "data" / "dynamic_rel_count.txt").is_file() and config.is_file():
        return work
    archive = DATASETS / f"{name}.tar.gz"
    if not archive.is_file():
        sys.exit(f"skipped: {archive} is absent")
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    shutil.copy(RECIPES / f"{name}.json", config)
    from pbgio.importers import import_edge_lists

    import_edge_lists(config, [work / name / f"{s}.tsv" for s in SPLITS], overwrite=True)
    return work


CHILD = CHILD_PROLOGUE + r"""
import json, time
from pathlib import Path
from typer.main import get_command
from pbgtrain.cli import app
from pbgtrain.config import load_run_config
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
from pbgio.checkpoint import CheckpointDir

work = Path(ARGS["work"])
started = time.time()
try:
    get_command(app).main(["fit", str(work / "config.json"), "-p", "edge_paths=data/train", "--no-progress",
                           "--valid", str(work / "data" / "valid"),
                           *[a for s in ("train", "valid", "test") for a in ("--filter", str(work / "data" / s))],
                           "--device", ARGS["device"], *ARGS["options"]], standalone_mode=False)
except SystemExit as stop:
    if stop.code:
        raise
fit_seconds = time.time() - started
ckpt = CheckpointDir(work / "model")
lines = ckpt.read_stats()
buckets = [l for l in lines if "stats" in l and "pbgtrain" in l and "trained_from" in l["pbgtrain"]]
records = [l["pbgtrain"]["validation"] for l in lines if "validation" in l.get("pbgtrain", {})]
best = records[-1]["best_version"]
first = min(l["pbgtrain"]["trained_from"] for l in buckets)
until = {l["epoch_idx"] + 1: l["pbgtrain"]["trained_until"] for l in buckets}  # one bucket, one chunk
edges = sum(l["stats"]["count"] for l in buckets)
train_seconds = sum(l["pbgtrain"]["trained_until"] - l["pbgtrain"]["trained_from"] for l in buckets)
run = load_run_config(work / "config.json", ["checkpoint_path=model/best"])
test = evaluate_checkpoint(run, EvalOptions(edge_paths=[work / "data" / "test"], device=ARGS["device"],
                                            filter_paths=[work / "data" / s for s in ("train", "valid", "test")]))
m = test.metrics
emit(best_version=best, epochs=max(until), minutes_to_best=(until[best] - first) / 60,
     minutes=fit_seconds / 60, edges_per_s=edges / train_seconds,
     valid=[(r["version"], r["metrics"]["mrr"]) for r in records],
     mrr=m.mrr, hits1=m.hits[1], hits10=m.hits[10], mr=m.mr, protocol=m.protocol.describe(), count=m.count)
"""


def run_recipe(root: Path, name: str, device: str = "cpu", extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Train and evaluate ``name``'s recipe on ``device``, ``extra`` fit options after the recipe's."""
    work = prepare(root, name)
    shutil.rmtree(work / "model", ignore_errors=True)
    options = [*recipe_options(name)[0], *extra]
    print(f"{name}: pbgtrain fit {work / 'config.json'} -p edge_paths=data/train --valid … --device {device} "
          f"{' '.join(options)}", flush=True)
    run = run_python(CHILD, {"work": str(work), "options": options, "device": device})
    if not run.ok:
        sys.exit(f"{name}: training failed: {run.failure()}")
    return {**run.result, "peak_rss_bytes": run.peak_rss_bytes, "log": run.stderr}


PYKEEN_CHILD = CHILD_PROLOGUE + r"""
import time, torch
from pykeen.triples import TriplesFactory
from pykeen.models import ComplEx
from pykeen.training import LCWATrainingLoop, SLCWATrainingLoop
from pykeen.evaluation import RankBasedEvaluator
from pykeen.regularizers import LpRegularizer

torch.set_num_threads(ARGS["threads"])
data = ARGS["data"]
train = TriplesFactory.from_path(f"{data}/train.tsv", create_inverse_triples=ARGS["mode"] == "lcwa")
ids = {"entity_to_id": train.entity_to_id, "relation_to_id": train.relation_to_id}
valid = TriplesFactory.from_path(f"{data}/valid.tsv", **ids)
test = TriplesFactory.from_path(f"{data}/test.tsv", **ids)
model = ComplEx(triples_factory=train, embedding_dim=ARGS["dimension"] // 2, random_seed=0,
                loss="crossentropy" if ARGS["mode"] == "lcwa" else "softplus",
                regularizer=LpRegularizer(p=3.0, weight=ARGS["reg"], normalize=False))
optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
if ARGS["mode"] == "lcwa":
    loop = LCWATrainingLoop(model=model, triples_factory=train, optimizer=optimizer)
else:
    loop = SLCWATrainingLoop(model=model, triples_factory=train, optimizer=optimizer,
                             negative_sampler_kwargs={"num_negs_per_pos": ARGS["negatives"]})
started, epochs = now(), 0
while now() - started < ARGS["minutes"] * 60:
    loop.train(triples_factory=train, num_epochs=epochs + 1, batch_size=ARGS["batch"], continue_training=epochs > 0,
               use_tqdm=False)
    epochs += 1
train_seconds = now() - started
evaluated = now()
result = RankBasedEvaluator(filtered=True).evaluate(
    model, test.mapped_triples, additional_filter_triples=[train.mapped_triples, valid.mapped_triples],
    batch_size=ARGS["eval_batch"], use_tqdm=False)
emit(epochs=epochs, minutes=train_seconds / 60, eval_seconds=now() - evaluated,
     mrr=result.get_metric("both.realistic.inverse_harmonic_mean_rank"),
     hits1=result.get_metric("both.realistic.hits_at_1"), hits10=result.get_metric("both.realistic.hits_at_10"))
"""


def pykeen_python(root: Path, version: str) -> Path:
    """The side venv's interpreter, PyKEEN installed (once)."""
    venv = root / f"pykeen-{version}-venv"
    python = venv / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(REPO_ROOT / "constraints" / "dev.txt"),
                        f"pykeen=={version}"], check=True)
    return python


def run_pykeen(python: Path, root: Path, name: str, mode: str, minutes: float) -> dict[str, Any]:
    config = json.loads((RECIPES / f"{name}.json").read_text(encoding="utf-8"))
    work = prepare(root, name)
    args = {"data": str(work / name), "mode": mode, "minutes": minutes, "dimension": config["dimension"],
            "reg": config["regularization_coef"], "batch": config["batch_size"], "negatives": 1000,
            "threads": __import__("os").cpu_count(), "eval_batch": 256}
    with_side = dict(__import__("os").environ, PYTHONPATH="")
    from _benchutil import run_child

    run = run_child([str(python), "-c", PYKEEN_CHILD, json.dumps(args)], cwd=root, env=with_side)
    if not run.ok:
        return {"failed": run.failure()}
    return {**run.result, "peak_rss_bytes": run.peak_rss_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("datasets", nargs="*", default=["fb15k-237", "wn18rr", "kinship", "umls", "nations"])
    parser.add_argument("--root", type=Path, default=REPO_ROOT / "bench-data" / "quality")
    parser.add_argument("--pykeen", action="store_true", help="also train PyKEEN's ComplEx (side venv)")
    parser.add_argument("--pykeen-only", action="store_true", help="only PyKEEN (pbgtrain's figures from an "
                        "earlier run of this benchmark)")
    parser.add_argument("--pykeen-modes", default="lcwa,slcwa", help="PyKEEN training loops to run, of lcwa,slcwa")
    parser.add_argument("--pykeen-version", default="1.11.1")
    parser.add_argument("--pykeen-minutes", type=float, default=None,
                        help="training minutes per PyKEEN mode (default: the recipe's --max-minutes)")
    parser.add_argument("--device", default="cpu", help="train and evaluate on this device (cpu, cuda, cuda:N)")
    parser.add_argument("--extra", default="", help="fit options added after the recipe's, as one string (a try "
                        "beside the recipe, e.g. '--relation-prediction 1'); said in the output")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    import torch

    print(f"CPU capability: {torch.backends.cpu.get_cpu_capability()}, {__import__('os').cpu_count()} cores")
    rows, figures = [], {}
    for name in args.datasets:
        figures[name] = {}
        if args.pykeen_only:
            prepare(args.root, name)
        else:
            ours = run_recipe(args.root, name, args.device, tuple(args.extra.split()))
            figures[name]["pbgtrain"] = ours
            label = f"pbgtrain (recipe{' ' + args.extra if args.extra else ''}, {args.device})"
            rows.append([name, label, f"{ours['mrr']:.4f}", f"{ours['hits1']:.4f}",
                         f"{ours['hits10']:.4f}", f"{ours['minutes_to_best']:.1f}", f"{ours['minutes']:.1f}",
                         f"{ours['edges_per_s']:,.0f}", f"{ours['peak_rss_bytes'] / 2**30:.2f}"])
            print(f"  valid MRR by version: {', '.join(f'v{v} {m:.4f}' for v, m in ours['valid'])}; picked "
                  f"v{ours['best_version']}; test: MRR {ours['mrr']:.4f} [{ours['protocol']}; {ours['count']:,} "
                  "edges]", flush=True)
        if args.pykeen or args.pykeen_only:
            python = pykeen_python(args.root, args.pykeen_version)
            minutes = args.pykeen_minutes or recipe_options(name)[1]
            for mode in args.pykeen_modes.split(","):
                theirs = run_pykeen(python, args.root, name, mode, minutes)
                figures[name][f"pykeen_{mode}"] = theirs
                if "failed" in theirs:
                    print(f"  PyKEEN {mode}: {theirs['failed']}")
                    continue
                rows.append([name, f"PyKEEN {args.pykeen_version} {mode.upper()} ({theirs['epochs']} ep.)",
                             f"{theirs['mrr']:.4f}", f"{theirs['hits1']:.4f}", f"{theirs['hits10']:.4f}", "—",
                             f"{theirs['minutes']:.1f}", "", f"{theirs['peak_rss_bytes'] / 2**30:.2f}"])
    print(format_table(["dataset", "run", "test MRR", "Hits@1", "Hits@10", "min to best", "min", "edges/s",
                        "peak GiB"], rows))
    for name in args.datasets:
        print(f"{name}: published {PUBLISHED.get(name, '— (none verified here)')}; {ORIGINAL.get(name, '')}")
    if args.json:
        from _benchutil import environment

        write_json(args.json, {"environment": environment(), **figures})


if __name__ == "__main__":
    main()
