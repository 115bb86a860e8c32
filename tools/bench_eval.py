"""Seconds of ``pbgtrain eval`` (all entities as candidates, filtered) beside the in-fit validation
(``pbgtrain fit --valid``) of the same edges, on a graph of WordNet's shape, for this checkout and
(``--baseline ROOT``) another one, side by side in the same session.

The graph (written once under ``--root``, reused while its parameters match): ``--entities`` synsets
(one type, one partition), 22 relations, as WordNet's: 7 pairs of inverse relations (hypernym and
hyponym, …), 5 symmetric ones and 3 without a twin, ``--edges`` edges split 90/5/5 into train,
valid and test CSV files, imported with ``pbgio import``, and a model (``--dimension``, ComplEx,
dynamic relations) trained one epoch on train with this checkout.

Then, ``--repeat`` rounds, each alternating the jobs (and the checkouts) so that a busy moment of
the machine hits all of them, each job a fresh child process:

1. ``eval``: ``pbgtrain eval CONFIG --edges data/valid --filter data/train --filter data/valid``
   (the whole command: interpreter start, imports, the checkpoint read; its wall time), and the
   seconds the command itself reports (``--json``: ``seconds``);
2. ``validation``: what the fit loop calls after a commit,
   :func:`pbgtrain.early_stopping.checkpoint_evaluator` on data/valid with the same filters (its time
   alone, as the fit's validation line reports it).

Printed: each job's seconds in every round, the median, and the spread ((max - min) / median).
Figures are printed, never asserted.

    .venv/bin/python tools/bench_eval.py --baseline /tmp/before
    .venv/bin/python tools/bench_eval.py --entities 20000 --edges 50000 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _benchutil import (
    CHILD_PROLOGUE,
    REPO_ROOT,
    environment,
    format_table,
    run_python,
    run_python_module,
    warm_page_cache,
    write_json,
)

INVERSES = (("hypernym", "hyponym"), ("part_holonym", "part_meronym"), ("member_holonym", "member_meronym"),
            ("substance_holonym", "substance_meronym"), ("instance_hypernym", "instance_hyponym"),
            ("domain_topic", "member_of_domain_topic"), ("domain_region", "member_of_domain_region"))
SYMMETRIC = ("similar_to", "derivationally_related", "also_see", "verb_group", "antonym")
ONE_WAY = ("cause", "entailment", "attribute")
FILTERS = ["--filter", "data/train", "--filter", "data/valid"]

USAGE = r"""
import resource
def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt
"""

VALIDATION = CHILD_PROLOGUE + USAGE + r"""
import pbgtrain
from pathlib import Path
from pbgtrain.config import load_run_config
from pbgtrain.training.fit_plan import ValidationOptions
from pbgtrain.early_stopping import checkpoint_evaluator

layout = load_run_config(ARGS["config"], [])
evaluate = checkpoint_evaluator(layout, ValidationOptions("data/valid", ("data/train", "data/valid")), None, 0)
started, cpu, faults = now(), *usage()
evaluate(1)
emit(code=pbgtrain.__file__, seconds=now() - started, cpu=usage()[0] - cpu, faults=usage()[1] - faults)
"""

EVAL = CHILD_PROLOGUE + USAGE + r"""
import resource
import torch
import pbgtrain
from pbgtrain.cli import app

started, cpu, faults = now(), *usage()
try:
    app(ARGS["argv"], standalone_mode=False)
except SystemExit:
    pass
emit(code=pbgtrain.__file__, seconds=now() - started, cpu=usage()[0] - cpu, faults=usage()[1] - faults)
"""


def write_graph(root: Path, entities: int, edges: int, dimension: int) -> Path:
    """The CSV files and config of a WordNet-shaped graph (see the module doc) under ``root``."""
    rng = random.Random(46)
    names = [f"w{i}.n.{i:08d}" for i in range(entities)]
    kinds: list[tuple[str, ...]] = [*INVERSES, *((s,) for s in SYMMETRIC), *((o,) for o in ONE_WAY)]
    weights = [0.5] * len(INVERSES) + [0.08] * len(SYMMETRIC) + [0.01] * len(ONE_WAY)
    triples: set[tuple[int, str, int]] = set()
    while len(triples) < edges:
        kind = rng.choices(kinds, weights)[0]
        a, b = rng.randrange(entities), rng.randrange(entities)
        if a == b:
            continue
        triples.add((a, kind[0], b))
        if len(kind) == 2:
            triples.add((b, kind[1], a))
        elif kind[0] in SYMMETRIC:
            triples.add((b, kind[0], a))
    shuffled = sorted(triples)
    rng.shuffle(shuffled)
    cut_valid, cut_test = int(0.9 * len(shuffled)), int(0.95 * len(shuffled))
    root.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", shuffled[:cut_valid]), ("valid", shuffled[cut_valid:cut_test]),
                        ("test", shuffled[cut_test:])):
        with (root / f"{split}.csv").open("w") as f:
            f.write("source,relation,target\n")
            f.writelines(f"{names[a]},{r},{names[b]}\n" for a, r, b in part)
    config = {"entities": {"synset": {"num_partitions": 1}},
              "relations": [{"name": "all_edges", "lhs": "synset", "rhs": "synset", "operator": "complex_diagonal"}],
              "dynamic_relations": True, "global_emb": False, "dimension": dimension, "comparator": "dot",
              "loss_fn": "softmax", "lr": 0.1, "num_epochs": 1, "entity_path": "data",
              "edge_paths": ["data/train", "data/valid", "data/test"], "checkpoint_path": "model"}
    path = root / "config.json"
    path.write_text(json.dumps(config, indent=4))
    return path


def prepare(root: Path, entities: int, edges: int, dimension: int) -> Path:
    """The graph imported and trained under ``root`` (reused when its marker matches)."""
    marker, wanted = root / "bench_eval.json", {"entities": entities, "edges": edges, "dimension": dimension}
    config = root / "config.json"
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return config
    for stale in ("data", "model"):
        shutil.rmtree(root / stale, ignore_errors=True)
    write_graph(root, entities, edges, dimension)
    for argv in (["pbgio", "import", str(config), "train.csv", "valid.csv", "test.csv", "-d", "comma", "--header"],
                 ["pbgtrain", "fit", str(config), "-p", "edge_paths=data/train", "--no-progress"]):
        subprocess.run([sys.executable, "-m", *argv], cwd=root, check=True, stdout=subprocess.DEVNULL)
    marker.write_text(json.dumps(wanted))
    return config


def eval_once(checkout: Path, config: Path) -> tuple[float, dict[str, float]]:
    """(wall seconds of the whole ``pbgtrain eval`` command, in a child of its own), and the figures of
    the command run in a child that imported torch and pbgtrain first (its seconds, CPU seconds,
    minor page faults)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = ["eval", str(config), "--edges", "data/valid", *FILTERS, "--json", "--no-progress"]
    whole = run_python_module("pbgtrain", argv, cwd=config.parent, env=env)
    if whole.returncode:
        sys.exit(f"eval with {checkout} failed: {whole.failure()}")
    return whole.wall_seconds, job(EVAL, checkout, config, argv)


def job(code: str, checkout: Path, config: Path, argv: list[str] | None = None) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    child = run_python(code, {"config": str(config), "argv": argv}, cwd=config.parent, env=env)
    if not child.ok:
        sys.exit(f"{code.split()[-1]} with {checkout} failed: {child.failure()}")
    if not child.result["code"].startswith(str(checkout)):
        sys.exit(f"the child imported {child.result['code']}, not the checkout {checkout}")
    return {key: float(child.result[key]) for key in ("seconds", "cpu", "faults")}


def spread(values: list[float]) -> str:
    return f"{(max(values) - min(values)) / statistics.median(values):.0%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout of pbg to compare with")
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--edges", type=int, default=250_000)
    parser.add_argument("--dimension", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--root", type=Path, default=REPO_ROOT / "bench-data" / "eval-wordnet")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    config = prepare(args.root.resolve(), args.entities, args.edges, args.dimension)
    warm_page_cache(p for p in config.parent.rglob("*.h5"))
    checkouts = {"this": REPO_ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    figures: dict[str, Any] = {"environment": environment(), "graph": vars(args) | {"root": str(args.root)},
                               "seconds": {}}
    jobs: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for label, checkout in checkouts.items():
            wall, command = eval_once(checkout, config)
            jobs.setdefault(f"{label} eval: whole command, s", []).append(wall)
            validation = job(VALIDATION, checkout, config)
            for name, figures_of in (("eval", command), ("validation", validation)):
                for key, unit in (("seconds", "s"), ("cpu", "CPU s"), ("faults", "page faults")):
                    jobs.setdefault(f"{label} {name}, {unit}", []).append(figures_of[key])
    rows = [[name, "  ".join(f"{v:,.1f}" if v < 1e4 else f"{v:,.0f}" for v in values),
             f"{statistics.median(values):,.1f}", spread(values)] for name, values in sorted(jobs.items())]
    print(format_table(["job", "per round", "median", "spread"], rows))
    figures["seconds"] = jobs
    if args.json:
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
