"""A graph of your own, from small to large: what to change first, as filtered MRR per minute.

On real graphs of 10⁵ entities or more built on this machine (nothing shipped, nothing downloaded
but Debian's WordNet package):

- ``wordnet``: WordNet 3.0, words and synsets (``tools/wordnet_graph.py``: 264,965 entities, 19
  relations, 442,334 edges; needs ``apt-get install wordnet-base``);
- ``code``: the code graph of the packages installed beside pbg (``tools/code_graph.py --source``
  this interpreter's site-packages; in the dev venv of ``constraints/dev.txt`` about 187,000
  entities and 322,000 edges, the count depends on the packages installed and is printed).

Each graph is split (5% valid, 5% test), imported once with a recipe's config (one entity type,
dynamic relations; ``recipes/own/sampled.json`` unless ``--recipe``), and each variant of
:data:`VARIANTS` (``-p`` overrides and fit options on top of the recipe's command of
``recipes/README.md``) trains in a child process: first ``--max-minutes`` the first of
``--minutes``, then resumed for the rest of the second, the version picked on the validation sample
(``model/best/``) evaluated on the test split after each (filtered against train, valid and test,
every entity a candidate, both sides). Printed: per graph and variant, test MRR (Hits@10) at each
mark, epochs, edges/s, peak RSS, and the ratio of each MRR to the recipe's.

    .venv/bin/python tools/bench_own_graph.py wordnet code                    # every variant, 5 and 15 minutes
    .venv/bin/python tools/bench_own_graph.py wordnet --variants recipe,d100 --minutes 1 3
    .venv/bin/python tools/bench_own_graph.py code --recipe recipes/own/sparse.json --variants recipe
    .venv/bin/python tools/bench_own_graph.py wordnet --variants "lr 1" --minutes 15 --resume-from 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from _benchutil import CHILD_PROLOGUE, REPO_ROOT, format_table, run_python, write_json

RECIPE = REPO_ROOT / "recipes" / "own" / "sampled.json"
SPLITS = ("train", "valid", "test")

VARIANTS: dict[str, list[str]] = {
    # the recipe's own command (recipes/README.md, "A recipe for a graph of your own"), then one change each
    "recipe": [],
    "d100": ["-p", "dimension=100"],
    "d400": ["-p", "dimension=400"],
    "negatives 50+50": ["-p", "num_batch_negs=50", "-p", "num_uniform_negs=50"],
    "negatives 500+2000": ["-p", "num_batch_negs=500", "-p", "num_uniform_negs=2000"],
    "lr .3": ["-p", "lr=0.3"],
    "lr .03": ["-p", "lr=0.03"],
    "batch 5000": ["-p", "batch_size=5000"],
    "N3 .005": ["-p", "regularization_coef=0.005"],
    "precision fp32": ["--precision", "fp32"],  # the recipe says auto: bf16 where the CPU computes it natively
    # on top of the first change that mattered on WordNet (lr .3): the sparse recipe was chosen among these
    "lr 1": ["-p", "lr=1"],
    "lr .3 d400": ["-p", "lr=0.3", "-p", "dimension=400"],
    "lr .3 N3 .005": ["-p", "lr=0.3", "-p", "regularization_coef=0.005"],
    "lr .3 negatives 50+50": ["-p", "lr=0.3", "-p", "num_batch_negs=50", "-p", "num_uniform_negs=50"],
    "lr .3 batch 5000": ["-p", "lr=0.3", "-p", "batch_size=5000"],
}
"""One change each to the recipe: the knobs a user turns first (dimension, negatives, learning rate,
batch, regularization, precision); the epochs are the time axis (``--minutes``)."""


def build_graph(name: str, out: Path) -> None:
    """Write ``out/{train,valid,test}.tsv`` of graph ``name`` (once)."""
    if all((out / f"{s}.tsv").is_file() for s in SPLITS):
        return
    sys.path.insert(0, str(REPO_ROOT / "tools"))
    if name == "wordnet":
        from wordnet_graph import main as build
        build([str(out)])
    elif name == "code":
        from code_graph import main as build
        build([str(out), "--source", sysconfig.get_paths()["purelib"]])
    else:
        sys.exit(f"unknown graph {name!r}: wordnet or code")


def _import_fields(config: Path) -> dict[str, Any]:
    """What an import reads of a config: recipes that agree on these share one imported layout."""
    data = json.loads(config.read_text(encoding="utf-8"))
    return {key: data.get(key) for key in ("entities", "relations", "dynamic_relations", "entity_path", "edge_paths")}


def prepare(root: Path, name: str, recipe: Path) -> Path:
    """``root/NAME``: the graph's TSV files and its layout imported with ``recipe`` (reused when present)."""
    work = root / name
    config = work / "config.json"
    build_graph(name, work / "source")
    imported_alike = config.is_file() and _import_fields(config) == _import_fields(recipe)
    shutil.copy(recipe, config)
    if (work / "data" / "dynamic_rel_count.txt").is_file() and imported_alike:
        return work
    shutil.rmtree(work / "data", ignore_errors=True)
    from pbgio.importers import import_edge_lists

    import_edge_lists(config, [work / "source" / f"{s}.tsv" for s in SPLITS], overwrite=True)
    return work


CHILD = CHILD_PROLOGUE + r"""
import time
from pathlib import Path
from typer.main import get_command
from pbgtrain.cli import app
from pbgtrain.config import load_run_config
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
from pbgio.checkpoint import CheckpointDir

work, model = Path(ARGS["work"]), ARGS["model"]
filters = [a for s in ("train", "valid", "test") for a in ("--filter", str(work / "data" / s))]
started = time.time()
try:
    get_command(app).main(["fit", str(work / "config.json"), "-p", "edge_paths=data/train", "-p",
                           f"checkpoint_path={model}", "--no-progress", "--valid", str(work / "data" / "valid"),
                           *filters, *ARGS["options"]], standalone_mode=False)
except SystemExit as stop:
    if stop.code:
        raise
fit_seconds = time.time() - started
lines = CheckpointDir(work / model).read_stats()
buckets = [l for l in lines if "stats" in l and "trained_from" in l.get("pbgtrain", {})]
records = [l["pbgtrain"]["validation"] for l in lines if "validation" in l.get("pbgtrain", {})]
edges = sum(l["stats"]["count"] for l in buckets)
train_seconds = sum(l["pbgtrain"]["trained_until"] - l["pbgtrain"]["trained_from"] for l in buckets)
picked = "best" if (work / model / "best").is_dir() else ""
run = load_run_config(work / "config.json", [f"checkpoint_path={model}/{picked}".rstrip("/")])
test = evaluate_checkpoint(run, EvalOptions(edge_paths=[work / "data" / "test"],
                                            filter_paths=[work / "data" / s for s in ("train", "valid", "test")]))
m = test.metrics
emit(best_version=records[-1]["best_version"] if records else None, picked=picked or "last",
     epochs=max((l["epoch_idx"] + 1 for l in buckets), default=0), fit_minutes=fit_seconds / 60,
     edges_per_s=edges / train_seconds if train_seconds else 0.0,
     valid=[(r["version"], r["metrics"]["mrr"]) for r in records], mrr=m.mrr, hits10=m.hits[10], count=m.count)
"""


def recipe_options(minutes: float) -> list[str]:
    """The fit options of the own-graph recipe's command in recipes/README.md, with ``--max-minutes``
    replaced by ``minutes`` (the validation options stay; the paths are the child's)."""
    text = (REPO_ROOT / "recipes" / "README.md").read_text(encoding="utf-8")
    lines = text[text.index("pbgtrain fit own/config.json"):].splitlines()
    command: list[str] = []
    for line in lines:  # the command's lines, continued by a backslash
        command += line.removesuffix("\\").split()
        if not line.endswith("\\"):
            break
    options: list[str] = []
    skip = {"-p", "--valid", "--filter", "--max-minutes"}  # given by the child or replaced here
    i = 3
    while i < len(command):
        if command[i] in skip:
            i += 2
            continue
        options.append(command[i])
        i += 1
    return [*options, "--max-minutes", f"{minutes:g}"]


def run_variant(work: Path, recipe: str, variant: str, marks: list[float], resume_from: float = 0.0
                ) -> list[dict[str, Any]]:
    """``variant`` of ``recipe`` (its name) trained to each mark of ``marks`` (minutes; each run
    resumes the one before), evaluated on test after each. With ``resume_from`` M > 0 the variant's
    model folder holds a run to M minutes already (an earlier call's): it is resumed, and the marks
    up to M are not run again."""
    model = f"model-{recipe}-{variant.replace(' ', '-')}"
    if resume_from <= 0:
        shutil.rmtree(work / model, ignore_errors=True)
    elif not (work / model / "checkpoint_version.txt").is_file():
        sys.exit(f"--resume-from {resume_from:g}: {work / model} holds no run of {variant!r} to resume")
    figures, done = [], resume_from
    for mark in (m for m in marks if m > resume_from):
        options = [*recipe_options(mark - done), *VARIANTS[variant]]
        run = run_python(CHILD, {"work": str(work), "model": model, "options": options})
        if not run.ok:
            sys.exit(f"{work.name} / {variant}: failed: {run.failure()}")
        figures.append({**run.result, "minutes": mark, "peak_rss_bytes": run.peak_rss_bytes})
        print(f"  {variant} at {mark:g} min: test MRR {run.result['mrr']:.4f} (Hits@10 {run.result['hits10']:.4f}) "
              f"of version {run.result['best_version']} ({run.result['picked']}); {run.result['epochs']} epochs, "
              f"{run.result['edges_per_s']:,.0f} edges/s; valid {run.result['valid'][-3:]}", flush=True)
        done = mark
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("graphs", nargs="+", choices=["wordnet", "code"])
    parser.add_argument("--root", type=Path, default=REPO_ROOT / "bench-data" / "own-graph")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the config every variant starts from")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    parser.add_argument("--minutes", type=float, nargs="+", default=[5.0, 15.0],
                        help="the marks at which the picked version is evaluated on test")
    parser.add_argument("--resume-from", type=float, default=0.0, metavar="MINUTES",
                        help="each variant's model folder holds a run to MINUTES already (an earlier call with "
                             "that mark): resume it to the later marks instead of starting afresh")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        sys.exit(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")

    import torch

    print(f"CPU capability: {torch.backends.cpu.get_cpu_capability()}, {__import__('os').cpu_count()} cores; "
          f"recipe {args.recipe}; fit options {' '.join(recipe_options(args.minutes[0]))}")
    rows: list[list[str]] = []
    figures: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for graph in args.graphs:
        work = prepare(args.root, graph, args.recipe.resolve())
        figures[graph] = {}
        for variant in variants:
            figures[graph][variant] = run_variant(work, args.recipe.stem, variant, sorted(args.minutes),
                                                   args.resume_from)
        base = figures[graph].get("recipe") if args.resume_from <= 0 else None
        for variant, marks in figures[graph].items():
            cells = []
            for i, mark in enumerate(marks):
                ratio = f" ({mark['mrr'] / base[i]['mrr']:.2f}×)" if base and variant != "recipe" else ""
                cells.append(f"{mark['mrr']:.4f}{ratio}")
            last = marks[-1]
            rows.append([graph, variant, *cells, str(last["epochs"]), f"{last['edges_per_s']:,.0f}",
                         f"{max(m['peak_rss_bytes'] for m in marks) / 2**30:.2f}"])
    shown = [m for m in sorted(args.minutes) if m > args.resume_from]
    print(format_table(["graph", "variant", *(f"test MRR at {m:g} min" for m in shown), "epochs",
                        "edges/s", "peak GiB"], rows))
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
