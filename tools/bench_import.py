"""Benchmark ``pbgio import``: FB15k-237 and a generated edge list of 50M edges over 5M entities.

    python tools/bench_import.py                          # both cases
    python tools/bench_import.py --case fb15k --repeat 5  # FB15k-237 only
    python tools/bench_import.py --case generated --edges 10000000 --entities 1000000
    python tools/bench_import.py --case generated --entities 1000000   # 50M edges: memory vs edges
    python tools/bench_import.py --json bench-data/import.json

**FB15k-237** comes from ``../shared/datasets/fb15k-237.tar.gz`` (the case is skipped when the
archive is absent), unpacked into ``bench-data/datasets/``. train, valid and test go into three
edge paths sharing one dictionary (one entity type ``all``, dynamic relations, as the original's
FB15k example). Measured, each in a fresh child process (peak RSS is that process's ``VmHWM``,
interpreter and imports included; see ``tools/_benchutil.py``):

1. ``library``: :func:`pbgio.importers.import_edge_lists` after the imports, ``--repeat`` times
   into fresh directories in one process; the first run is the cold one;
2. ``cli``: ``pbgio import`` end to end (interpreter start and imports included).

The result is validated with ``pbgio.validate.validate_path`` and must pass.

**Generated**: ``--edges`` edges over ``--entities`` entities and ``--relations`` relation types,
written once as TSV into ``bench-data/import-<edges>-<entities>/edges.tsv`` (reused while
its marker matches; never commit it). Left entities follow a power law (entity ``floor(N u^3)`` under a
fixed random relabelling), right entities are uniform, and the first ``--entities`` edges
cover every entity once. The config has one type ``node`` with ``--partitions`` partitions
and dynamic relations. It is imported once in a fresh child process (library call), then validated.

Reference figures of the original importer on the 2-core development machine
(``../shared/datasets/README.md``): FB15k-237 train alone in 3.6 s (about 75k edges/s); a 1M-node,
10M-edge power-law edge list in 112 s (about 89k edges/s, 615 MiB). The raw edge list "held in
memory" is estimated from a 1M-line sample: as a polars table of three string columns and as the
Python lists of strings the original builds. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _benchutil import (
    CHILD_PROLOGUE,
    MB,
    MIB,
    REPO_ROOT,
    ChildRun,
    environment,
    format_table,
    run_python,
    warm_page_cache,
    write_json,
)

DATASETS = REPO_ROOT.parent / "shared" / "datasets"
FB15K_ARCHIVE = DATASETS / "fb15k-237.tar.gz"
SPLITS = ("train", "valid", "test")
ORIGINAL_FB15K_EDGES_PER_S = 75_000  # 272,115 training edges in 3.6 s
ORIGINAL_GENERATED_EDGES_PER_S = 89_000  # 10M edges in 112 s, 615 MiB
MARKER = ".bench-import-dataset.json"

LIBRARY_CHILD = CHILD_PROLOGUE + """
import shutil
from pathlib import Path
from pbgio.importers import import_edge_lists
import pbgio.importers.importer, pbgio.validate, polars, h5py  # imports are not import work
root = Path(ARGS["root"])
rss_start = peak_rss_bytes()
runs = []
for i in range(ARGS["repeat"]):
    for d in ARGS["clean"]:
        shutil.rmtree(root / d, ignore_errors=True)
    t0 = now()
    report = import_edge_lists(root / "config.json", ARGS["inputs"])
    runs.append(now() - t0)
emit(seconds=runs[0], runs=runs, read=report.read, kept=report.kept, entities=report.entities,
     relation_types=report.relation_types, buckets=report.buckets, rss_start=rss_start)
"""

CLI_CHILD = CHILD_PROLOGUE + """
import sys
from pbgio.cli.commands import app
from pbgio.cli.importing import import_edges
if "import" not in [c.name for c in app.registered_commands]:
    app.command("import")(import_edges)
sys.argv = ["pbgio", "import", *ARGS["argv"]]
try:
    app()
except SystemExit as exc:
    if exc.code not in (0, None):
        raise
"""

VALIDATE_CHILD = CHILD_PROLOGUE + """
from pathlib import Path
from pbgio.validate import validate_path
t0 = now()
report = validate_path(Path(ARGS["config"]))
emit(seconds=now() - t0, ok=report.ok, issues=[str(i) for i in report.issues[:5]], checked=report.checked)
"""

SAMPLE_CHILD = CHILD_PROLOGUE + """
import sys
import polars as pl
lines = []
with open(ARGS["path"], encoding="utf-8") as f:
    for i, line in enumerate(f):
        if i >= ARGS["lines"]:
            break
        lines.append(line.rstrip("\\n").split("\\t"))
n = len(lines)
python_bytes = sys.getsizeof(lines) + sum(sys.getsizeof(r) + sum(sys.getsizeof(s) for s in r) for r in lines)
frame = pl.DataFrame(lines, schema=["lhs", "rel", "rhs"], orient="row")
emit(lines=n, python_bytes=python_bytes, polars_bytes=frame.estimated_size())
"""


def fb15k_config(root: Path) -> Path:
    config = root / "config.json"
    config.write_text(json.dumps({
        "entities": {"all": {"num_partitions": 1}},
        "relations": [{"name": "all_edges", "lhs": "all", "rhs": "all", "operator": "complex_diagonal"}],
        "dynamic_relations": True, "global_emb": False, "dimension": 400, "comparator": "dot",
        "loss_fn": "softmax", "lr": 0.1, "num_epochs": 50, "num_uniform_negs": 1000,
        "regularization_coef": 1e-3, "eval_fraction": 0,
        "entity_path": "data", "edge_paths": [f"data/{s}" for s in SPLITS], "checkpoint_path": "model",
    }, indent=4), encoding="utf-8")
    return config


def generated_config(root: Path, partitions: int) -> Path:
    config = root / "config.json"
    config.write_text(json.dumps({
        "entities": {"node": {"num_partitions": partitions}},
        "relations": [{"name": "link", "lhs": "node", "rhs": "node", "operator": "translation"}],
        "dynamic_relations": True, "global_emb": False, "dimension": 100,
        "entity_path": "data", "edge_paths": ["data/edges"], "checkpoint_path": "model",
    }, indent=4), encoding="utf-8")
    return config


def generate(path: Path, spec: dict[str, int]) -> float:
    """Write the generated edge list (see the module doc); return the seconds it took."""
    import numpy as np
    import polars as pl

    start = time.perf_counter()
    edges, entities, relations = spec["edges"], spec["entities"], spec["relations"]
    rng = np.random.default_rng(spec["seed"])
    label = rng.permutation(entities)
    tmp = path.with_name(path.name + ".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with tmp.open("wb") as out:
        while written < edges:
            n = min(5_000_000, edges - written)
            lhs = label[np.minimum((entities * rng.random(n) ** 3).astype(np.int64), entities - 1)]
            index = np.arange(written, written + n)
            rhs = np.where(index < entities, label[index % entities], rng.integers(0, entities, n))
            rel = rng.integers(0, relations, n)
            frame = pl.DataFrame({"l": lhs, "r": rel, "h": rhs}).select(
                pl.format("n{}", "l"), pl.format("rel{}", "r"), pl.format("n{}", "h"))
            frame.write_csv(out, separator="\t", include_header=False, quote_style="never")
            written += n
            print(f"\rgenerating: {written:,} / {edges:,} edges", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    tmp.replace(path)
    seconds = time.perf_counter() - start
    (path.parent / MARKER).write_text(json.dumps({"spec": spec, "seconds": seconds}), encoding="utf-8")
    return seconds


def check(run: ChildRun, what: str) -> dict[str, Any]:
    if not run.ok:
        raise SystemExit(f"{what} failed: {run.failure()}")
    return run.result


def memory_estimate(path: Path, edges: int) -> dict[str, float]:
    sample = check(run_python(SAMPLE_CHILD, {"path": str(path), "lines": 1_000_000}), "sampling")
    scale = edges / max(sample["lines"], 1)
    return {"python_lists_mb": sample["python_bytes"] * scale / MB,
            "polars_table_mb": sample["polars_bytes"] * scale / MB}


def run_fb15k(args: argparse.Namespace) -> dict[str, Any] | None:
    if not FB15K_ARCHIVE.is_file():
        print(f"FB15k-237: skipped ({FB15K_ARCHIVE} is absent)")
        return None
    data = REPO_ROOT / "bench-data" / "datasets"
    if not (data / "fb15k-237" / "train.tsv").is_file():
        with tarfile.open(FB15K_ARCHIVE) as tar:
            tar.extractall(data, filter="data")
    source = data / "fb15k-237"
    root = REPO_ROOT / "bench-data" / "import-fb15k-237"
    root.mkdir(parents=True, exist_ok=True)
    config = fb15k_config(root)
    inputs = [str(source / f"{s}.tsv") for s in SPLITS]
    warm_page_cache(Path(p) for p in inputs)
    library = check(run_python(LIBRARY_CHILD, {"root": str(root), "inputs": inputs, "repeat": args.repeat,
                                               "clean": ["data"]}), "library import")
    lib_run_rss = run_python(LIBRARY_CHILD, {"root": str(root), "inputs": inputs, "repeat": 1, "clean": ["data"]})
    validation = check(run_python(VALIDATE_CHILD, {"config": str(config)}), "validation")
    cli = None
    if not args.no_cli:
        shutil.rmtree(root / "data", ignore_errors=True)
        cli_run = run_python(CLI_CHILD, {"argv": [str(config), *inputs, "--no-progress"]})
        if cli_run.returncode != 0:
            raise SystemExit(f"cli import failed: {cli_run.failure()}")
        cli = {"wall_seconds": cli_run.wall_seconds, "peak_rss_mb": cli_run.peak_rss_bytes / MB,
               "summary": cli_run.stderr.strip().splitlines()[:3]}
    edges = library["read"]
    train = 272_115
    runs = library["runs"]
    result = {
        "edges": edges, "train_edges": train, "entities": library["entities"],
        "relation_types": library["relation_types"], "validate_ok": validation["ok"],
        "validate_issues": validation["issues"],
        "cold_seconds": runs[0], "warm_seconds": runs[1:], "median_seconds": statistics.median(runs),
        "best_seconds": min(runs),
        "cold_edges_per_s": edges / runs[0], "median_edges_per_s": edges / statistics.median(runs),
        "best_edges_per_s": edges / min(runs),
        "peak_rss_mb": lib_run_rss.peak_rss_bytes / MB, "rss_before_job_mb": library["rss_start"] / MB,
        "cli": cli, "original_edges_per_s": ORIGINAL_FB15K_EDGES_PER_S,
    }
    rows = [
        ["library, cold (1st call)", f"{runs[0]:.3f}", f"{edges / runs[0]:,.0f}",
         f"{edges / runs[0] / ORIGINAL_FB15K_EDGES_PER_S:.1f}x", f"{result['peak_rss_mb']:,.0f}"],
        [f"library, median of {len(runs)}", f"{result['median_seconds']:.3f}",
         f"{result['median_edges_per_s']:,.0f}",
         f"{result['median_edges_per_s'] / ORIGINAL_FB15K_EDGES_PER_S:.1f}x", "-"],
        [f"library, best of {len(runs)}", f"{min(runs):.3f}", f"{result['best_edges_per_s']:,.0f}",
         f"{result['best_edges_per_s'] / ORIGINAL_FB15K_EDGES_PER_S:.1f}x", "-"],
    ]
    if cli is not None:
        rows.append(["cli end to end (process)", f"{cli['wall_seconds']:.3f}",
                     f"{edges / cli['wall_seconds']:,.0f}",
                     f"{edges / cli['wall_seconds'] / ORIGINAL_FB15K_EDGES_PER_S:.1f}x",
                     f"{cli['peak_rss_mb']:,.0f}"])
    print(f"\nFB15k-237: {edges:,} edges (train+valid+test) into 3 edge paths, "
          f"{sum(library['entities']['all']):,} entities, {library['relation_types']} relation types; "
          f"pbgio validate: {'valid' if validation['ok'] else 'INVALID'}")
    print(format_table(["run", "seconds", "edges/s", "vs original 75k/s", "peak RSS MB"], rows))
    return result


def _short(n: int) -> str:
    """50000000 -> '50M', 5000 -> '5k'."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def run_generated(args: argparse.Namespace) -> dict[str, Any]:
    spec = {"edges": args.edges, "entities": args.entities, "relations": args.relations, "seed": args.seed}
    root = (args.data or REPO_ROOT / "bench-data" / f"import-{_short(args.edges)}-{_short(args.entities)}").resolve()
    path = root / "edges.tsv"
    marker = root / MARKER
    current = json.loads(marker.read_text()) if marker.is_file() else None
    if args.regenerate or current is None or current.get("spec") != spec or not path.is_file():
        marker.unlink(missing_ok=True)
        print(f"generated: writing {path} ({args.edges:,} edges, {args.entities:,} entities) in "
              f"{generate(path, spec):.0f} s", file=sys.stderr)
    config = generated_config(root, args.partitions)
    size = path.stat().st_size
    memory = memory_estimate(path, args.edges)
    shutil.rmtree(root / "data", ignore_errors=True)
    run = run_python(LIBRARY_CHILD, {"root": str(root), "inputs": [str(path)], "repeat": 1, "clean": ["data"]})
    library = check(run, "generated import")
    validation = check(run_python(VALIDATE_CHILD, {"config": str(config)}), "validation")
    seconds = library["seconds"]
    result = {
        "edges": library["read"], "entities": sum(library["entities"]["node"]),
        "relation_types": library["relation_types"], "partitions": args.partitions,
        "seconds": seconds, "edges_per_s": library["read"] / seconds, "peak_rss_mb": run.peak_rss_bytes / MB,
        "peak_rss_mib": run.peak_rss_bytes / MIB, "process_wall_seconds": run.wall_seconds,
        "file_mb": size / MB, "raw_in_memory": memory, "validate_ok": validation["ok"],
        "validate_seconds": validation["seconds"], "validate_issues": validation["issues"],
        "original_edges_per_s": ORIGINAL_GENERATED_EDGES_PER_S,
    }
    print(f"\ngenerated: {result['edges']:,} edges, {result['entities']:,} entities, "
          f"{result['relation_types']} relation types, {args.partitions} partitions "
          f"({args.partitions ** 2} buckets); pbgio validate: {'valid' if validation['ok'] else 'INVALID'} "
          f"({validation['seconds']:.1f} s)")
    print(format_table(["figure", "value"], [
        ["import seconds (library call)", f"{seconds:.1f}"],
        ["edges/s", f"{result['edges_per_s']:,.0f} ({result['edges_per_s'] / ORIGINAL_GENERATED_EDGES_PER_S:.1f}x "
                    "the original's 89k)"],
        ["peak RSS (process)", f"{result['peak_rss_mb']:,.0f} MB"],
        ["process wall seconds", f"{run.wall_seconds:.1f}"],
        ["edge list file", f"{size / MB:,.0f} MB"],
        ["raw edge list in memory: polars table", f"{memory['polars_table_mb']:,.0f} MB (estimated)"],
        ["raw edge list in memory: Python lists", f"{memory['python_lists_mb']:,.0f} MB (estimated)"],
        ["peak RSS / raw edge list", f"{run.peak_rss_bytes / size:.0%} of the file, "
                                     f"{result['peak_rss_mb'] / memory['polars_table_mb']:.0%} of the polars table"],
    ]))
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Benchmark pbgio import.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--case", choices=("all", "fb15k", "generated"), default="all")
    parser.add_argument("--repeat", type=int, default=5, help="FB15k-237 library runs in one process")
    parser.add_argument("--no-cli", action="store_true", help="skip the end-to-end CLI run of FB15k-237")
    parser.add_argument("--edges", type=int, default=50_000_000)
    parser.add_argument("--entities", type=int, default=5_000_000)
    parser.add_argument("--relations", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=None,
                        help="directory of the generated case (default: bench-data/import-<edges>-<entities>)")
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    figures: dict[str, Any] = {"environment": environment()}
    if args.case in ("all", "fb15k"):
        figures["fb15k_237"] = run_fb15k(args)
    if args.case in ("all", "generated"):
        figures["generated"] = run_generated(args)
    if args.json is not None:
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
