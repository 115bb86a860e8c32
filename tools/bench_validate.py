"""Benchmark ``pbgio validate`` against a raw h5py read of the same bucket data.

    python tools/bench_validate.py                      # 100M edges in bench-data/validate-100M
    python tools/bench_validate.py --edges 2000000 --data /tmp/bench-2M --repeat 3 --json out.json

Builds (or reuses) a synthetic current-layout dataset: one entity type ``node`` in
``--partitions`` partitions (P x P buckets), ``--relations`` relation types and
``--edges`` edges spread evenly over the buckets, written through
:class:`pbgio.edges.BucketWriter` in blocks so the files are exactly what pbgio
writes. A marker file written last records the parameters; a directory whose
marker matches is reused.

Then, with the page cache warmed by one read of every bucket file, it measures,
each run in a fresh child process, so that the peak RSS (``VmHWM`` of that process,
interpreter and imports included; see ``tools/_benchutil.py``) is that of the job alone:

1. baseline: every ``rel``/``lhs``/``rhs`` dataset of every bucket read with
   h5py ``read_direct`` into one preallocated buffer, ``--block`` elements at a time;
2. validate: ``pbgio.validate.validate_path(config, base=data_dir)``;
3. cli: ``pbgio validate config.json --base DATA --no-progress`` end to end
   (interpreter start and imports included).

Throughput is bytes of bucket index data (rel + lhs + rhs) per second, in
decimal MB/s, from the time the child measured around the job (wall time of the
whole process for the CLI). Runs of the jobs are interleaved and the best and
median of ``--repeat`` runs are shown. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from _benchutil import (
    CHILD_PROLOGUE,
    MB,
    REPO_ROOT,
    ChildRun,
    available_memory_bytes,
    best_and_median,
    environment,
    format_table,
    run_python,
    run_python_module,
    run_python_script,
    warm_page_cache,
    write_json,
)
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from pbgio.config import ConfigSchema
from pbgio.edges import BucketWriter, EdgeBucket
from pbgio.entities import write_entity_count
from pbgio.spec import naming
from pbgio.spec.edges import INDEX_DATASETS, READ_BLOCK_ELEMENTS
from pbgio.storage import atomic

MARKER = ".bench-validate-dataset.json"  # written last: its presence means the dataset is complete
ENTITY_TYPE = "node"
ENTITY_DIR = "entities"
EDGE_DIR = "edges"
CHECKPOINT_DIR = "model"  # named by the config, never created
DATASET_LAYOUT_VERSION = 1  # bump when the generator changes what it writes
OPERATORS = ("none", "translation", "diagonal", "linear", "affine", "complex_diagonal")

stderr = Console(stderr=True)


# --------------------------------------------------------------------------- dataset


@dataclass(frozen=True)
class DatasetSpec:
    edges: int
    partitions: int
    relations: int
    nodes_per_partition: int
    seed: int
    layout_version: int = DATASET_LAYOUT_VERSION

    def entity_counts(self) -> list[int]:
        """Entities per partition; they differ a little so each partition has its own limit."""
        step = self.nodes_per_partition // 64
        return [self.nodes_per_partition - p * step for p in range(self.partitions)]

    def buckets(self) -> list[tuple[int, int, int]]:
        """``(lhs, rhs, edges)`` of every bucket; the edges split as evenly as possible."""
        grid = [(lhs, rhs) for lhs in range(self.partitions) for rhs in range(self.partitions)]
        share, extra = divmod(self.edges, len(grid))
        return [(lhs, rhs, share + (i < extra)) for i, (lhs, rhs) in enumerate(grid)]

    def config(self) -> ConfigSchema:
        # model_validate rather than ConfigSchema(...): the same model, and mypy needs no pydantic plugin
        return ConfigSchema.model_validate({
            "entities": {ENTITY_TYPE: {"num_partitions": self.partitions}},
            "relations": [{"name": f"rel_{i}", "lhs": ENTITY_TYPE, "rhs": ENTITY_TYPE,
                           "operator": OPERATORS[i % len(OPERATORS)]} for i in range(self.relations)],
            "dimension": 16,
            "entity_path": ENTITY_DIR,
            "edge_paths": [EDGE_DIR],
            "checkpoint_path": CHECKPOINT_DIR,
            "dynamic_relations": False,
            "global_emb": True,
        })


def bucket_paths(data_dir: Path, spec: DatasetSpec) -> list[Path]:
    return [data_dir / EDGE_DIR / naming.bucket_file(lhs, rhs) for lhs, rhs, _ in spec.buckets()]


def read_marker(data_dir: Path) -> dict[str, Any] | None:
    try:
        marker: dict[str, Any] = json.loads((data_dir / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker


def reusable(data_dir: Path, spec: DatasetSpec) -> dict[str, Any] | None:
    """The marker of a complete dataset built with ``spec``, or None."""
    marker = read_marker(data_dir)
    if marker is None or marker.get("spec") != asdict(spec):
        return None
    expected = [data_dir / naming.CONFIG_JSON, *bucket_paths(data_dir, spec)]
    if not all(p.is_file() for p in expected):
        return None
    return marker


def clear_dataset(data_dir: Path) -> None:
    """Remove what an earlier build may have left (only files this script names)."""
    (data_dir / MARKER).unlink(missing_ok=True)
    (data_dir / naming.CONFIG_JSON).unlink(missing_ok=True)
    edge_dir, entity_dir = data_dir / EDGE_DIR, data_dir / ENTITY_DIR
    if edge_dir.is_dir():
        for p in edge_dir.iterdir():
            name = p.name.removeprefix(".").removesuffix(atomic.TMP_SUFFIX)
            if p.is_file() and naming.parse_bucket_file(name):
                p.unlink()
    if entity_dir.is_dir():
        for p in entity_dir.iterdir():
            name = p.name.removeprefix(".").removesuffix(atomic.TMP_SUFFIX)
            if p.is_file() and naming.parse_entity_count_file(name):
                p.unlink()


def build_dataset(data_dir: Path, spec: DatasetSpec, gen_block: int) -> float:
    """Write the config, entity counts and buckets; return the seconds it took."""
    start = time.perf_counter()
    clear_dataset(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    counts = spec.entity_counts()
    for part, count in enumerate(counts):
        write_entity_count(data_dir / ENTITY_DIR, ENTITY_TYPE, part, count)
    (data_dir / EDGE_DIR).mkdir(exist_ok=True)
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed:>13,.0f} / {task.total:,.0f} edges"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=stderr) as progress:
        task = progress.add_task("generating", total=spec.edges)
        for lhs, rhs, n in spec.buckets():
            name = naming.bucket_file(lhs, rhs)
            progress.update(task, description=f"writing {name}")
            rng = np.random.default_rng([spec.seed, lhs, rhs])
            with BucketWriter(data_dir / EDGE_DIR / name) as writer:
                for done in range(0, n, gen_block):
                    size = min(gen_block, n - done)
                    writer.append(EdgeBucket(
                        rel=rng.integers(0, spec.relations, size, dtype=np.int64),
                        lhs=rng.integers(0, counts[lhs], size, dtype=np.int64),
                        rhs=rng.integers(0, counts[rhs], size, dtype=np.int64),
                    ))
                    progress.advance(task, size)
    atomic.write_text(data_dir / naming.CONFIG_JSON, spec.config().to_json())
    seconds = time.perf_counter() - start
    atomic.write_text(data_dir / MARKER, json.dumps(
        {"spec": asdict(spec), "generation_seconds": seconds,
         "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2))
    return seconds


def bucket_data_size(paths: Sequence[Path]) -> tuple[int, int]:
    """``(bytes, edges)`` of the rel/lhs/rhs datasets of the buckets."""
    nbytes = edges = 0
    for path in paths:
        with h5py.File(path, "r") as f:
            nbytes += sum(f[name].shape[0] * f[name].dtype.itemsize for name in INDEX_DATASETS)
            edges += f["rel"].shape[0]
    return nbytes, edges


# --------------------------------------------------------------------------- jobs

BASELINE_CHILD = CHILD_PROLOGUE + """
import h5py
import numpy as np
block = ARGS["block"]
buf = np.empty(block, dtype=np.int64)
rss_start = peak_rss_bytes()
nbytes = edges = 0
t0 = now()
for path in ARGS["files"]:
    with h5py.File(path, "r") as f:
        for name in ARGS["datasets"]:
            ds = f[name]
            n = ds.shape[0]
            for start in range(0, n, block):
                end = min(n, start + block)
                ds.read_direct(buf, np.s_[start:end], np.s_[0:end - start])
            nbytes += n * ds.dtype.itemsize
        edges += f["rel"].shape[0]
seconds = now() - t0
emit(seconds=seconds, bytes=nbytes, edges=edges, rss_start=rss_start)
"""

VALIDATE_CHILD = CHILD_PROLOGUE + """
from pathlib import Path
from pbgio.validate import validate_path
rss_start = peak_rss_bytes()
t0 = now()
report = validate_path(Path(ARGS["config"]), base=Path(ARGS["base"]))
seconds = now() - t0
emit(seconds=seconds, ok=report.ok, kind=report.kind, issues=len(report.issues),
     errors=len(report.errors), warnings=len(report.warnings), checked=report.checked,
     first_issues=[str(i) for i in report.issues[:5]], rss_start=rss_start)
"""


def validate_unavailable() -> str | None:
    """Why ``pbgio.validate.validate_path`` cannot be benchmarked, or None when it can."""
    try:
        from pbgio.validate import validate_path  # noqa: F401
    except Exception as exc:
        return f"import pbgio.validate failed: {type(exc).__name__}: {exc}"
    return None


def cli_script() -> Path | None:
    """The ``pbgio`` console script beside this interpreter, if installed."""
    script = Path(sys.executable).parent / "pbgio"
    return script if script.is_file() else None


def cli_label() -> str:
    script = cli_script()
    return str(script) if script is not None else f"{Path(sys.executable).name} -m pbgio"


@dataclass
class Job:
    name: str
    description: str
    runs: list[ChildRun]

    def good(self, run: ChildRun) -> bool:
        """A run with figures: the CLI reports none and exits 1 on an invalid layout."""
        if self.name == "cli":
            return run.returncode in (0, 1)
        return run.ok

    def good_runs(self) -> list[ChildRun]:
        return [r for r in self.runs if self.good(r)]


def run_job(job: Job, data_dir: Path, files: list[Path], block: int) -> ChildRun:
    config = data_dir / naming.CONFIG_JSON
    if job.name == "baseline":
        return run_python(BASELINE_CHILD, {"files": [str(p) for p in files], "block": block,
                                           "datasets": list(INDEX_DATASETS)})
    if job.name == "validate":
        return run_python(VALIDATE_CHILD, {"config": str(config), "base": str(data_dir)})
    argv = ["validate", str(config), "--base", str(data_dir), "--no-progress"]
    script = cli_script()
    return run_python_script(script, argv) if script is not None else run_python_module("pbgio", argv)


# --------------------------------------------------------------------------- report


def summarize(job: Job, nbytes: int, baseline: dict[str, Any] | None) -> dict[str, Any]:
    runs = job.good_runs()
    if not runs:
        return {"job": job.name, "description": job.description, "runs": len(job.runs), "ok_runs": 0}
    seconds = [r.seconds for r in runs]
    best_s, median_s = best_and_median(seconds, higher_is_better=False)
    best_mbps, median_mbps = nbytes / best_s / MB, nbytes / median_s / MB
    summary: dict[str, Any] = {
        "job": job.name,
        "description": job.description,
        "runs": len(job.runs),
        "ok_runs": len(runs),
        "seconds": seconds,
        "best_seconds": best_s,
        "median_seconds": median_s,
        "best_mb_per_s": best_mbps,
        "median_mb_per_s": median_mbps,
        "peak_rss_mb": max(r.peak_rss_bytes for r in runs) / MB,
        "peak_rss_mb_runs": [r.peak_rss_bytes / MB for r in runs],
        "peak_rss_source": sorted({r.peak_rss_source for r in runs}),
        "rss_before_job_mb": (max(r.result["rss_start"] for r in runs) / MB
                              if all("rss_start" in r.result for r in runs) else None),
        "wall_seconds": [r.wall_seconds for r in runs],
    }
    if baseline is not None and "best_mb_per_s" in baseline:
        summary["best_vs_baseline"] = best_mbps / baseline["best_mb_per_s"]
        summary["median_vs_baseline"] = median_mbps / baseline["median_mb_per_s"]
    last = runs[-1]
    if job.name == "validate":
        summary["report"] = {k: last.result[k] for k in
                             ("ok", "kind", "issues", "errors", "warnings", "checked", "first_issues")}
    elif job.name == "cli":
        summary["exit_code"] = last.returncode
        summary["stderr_tail"] = " ".join(last.stderr.split())[-500:]
    return summary


def print_table(summaries: list[dict[str, Any]]) -> None:
    header = ["job", "runs", "best s", "median s", "best MB/s", "median MB/s",
              "x baseline (best)", "x baseline (median)", "peak RSS MB", "RSS before job MB"]
    rows = []
    for s in summaries:
        if not s.get("ok_runs"):
            rows.append([s["job"], f"0/{s['runs']}", "failed", *["-"] * (len(header) - 3)])
            continue
        ratio_best, ratio_median = s.get("best_vs_baseline"), s.get("median_vs_baseline")
        rss0 = s.get("rss_before_job_mb")
        rows.append([
            s["job"], f"{s['ok_runs']}/{s['runs']}", f"{s['best_seconds']:.3f}", f"{s['median_seconds']:.3f}",
            f"{s['best_mb_per_s']:,.0f}", f"{s['median_mb_per_s']:,.0f}",
            "-" if ratio_best is None else f"{ratio_best:.2f}",
            "-" if ratio_median is None else f"{ratio_median:.2f}",
            f"{s['peak_rss_mb']:,.0f}", "-" if rss0 is None else f"{rss0:,.0f}",
        ])
    print(format_table(header, rows))


# --------------------------------------------------------------------------- main


def edges_label(edges: int) -> str:
    return f"{edges / 1_000_000:g}M" if edges >= 1_000_000 and edges % 100_000 == 0 else str(edges)


def positive_int(text: str) -> int:
    value = int(text.replace("_", ""))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {text!r}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark pbgio validate against a raw h5py read of the same buckets.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data", type=Path, default=None,
                        help="dataset directory (default: bench-data/validate-<edges> in the repo)")
    parser.add_argument("--edges", type=positive_int, default=100_000_000, help="edges in all")
    parser.add_argument("--partitions", type=positive_int, default=4, help="partitions of 'node'")
    parser.add_argument("--relations", type=positive_int, default=4, help="relation types")
    parser.add_argument("--nodes", type=positive_int, default=2_000_000,
                        help="entities in partition 0 (later partitions have a little fewer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gen-block", type=positive_int, default=4 << 20,
                        help="edges per BucketWriter.append when generating")
    parser.add_argument("--block", type=positive_int, default=READ_BLOCK_ELEMENTS,
                        help="elements per read in the baseline (default: the validator's block)")
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs of each measurement")
    parser.add_argument("--no-cli", action="store_true", help="skip the end-to-end CLI measurement")
    parser.add_argument("--regenerate", action="store_true", help="rebuild the dataset even if complete")
    parser.add_argument("--generate-only", action="store_true", help="build the dataset and stop")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    spec = DatasetSpec(edges=args.edges, partitions=args.partitions, relations=args.relations,
                       nodes_per_partition=args.nodes, seed=args.seed)
    data_dir = (args.data or REPO_ROOT / "bench-data" / f"validate-{edges_label(args.edges)}").resolve()
    files = bucket_paths(data_dir, spec)

    marker = None if args.regenerate else reusable(data_dir, spec)
    if marker is None:
        if min(spec.entity_counts()) <= 0:
            raise SystemExit(f"--nodes {args.nodes} is too small for {args.partitions} partitions")
        existing = next(p for p in (data_dir, *data_dir.parents) if p.exists())
        free = shutil.disk_usage(existing).free
        need = args.edges * 8 * len(INDEX_DATASETS)
        if need > free:
            stderr.print(f"[yellow]warning:[/] about {need / MB:,.0f} MB needed, {free / MB:,.0f} MB free")
        stderr.print(f"building {args.edges:,} edges in {len(files)} buckets under {data_dir}")
        generation_seconds = build_dataset(data_dir, spec, args.gen_block)
        print(f"generated {args.edges:,} edges in {len(files)} buckets in {generation_seconds:.1f} s "
              f"({args.edges / generation_seconds / 1e6:.2f} M edges/s)")
        reused = False
    else:
        generation_seconds = float(marker.get("generation_seconds", float("nan")))
        print(f"reusing {data_dir} (generated in {generation_seconds:.1f} s on {marker.get('created')})")
        reused = True
    if args.generate_only:
        return 0

    nbytes, edges = bucket_data_size(files)
    file_bytes = sum(p.stat().st_size for p in files)
    available = available_memory_bytes()
    if available is not None and file_bytes > 0.8 * available:
        stderr.print(f"[yellow]warning:[/] {file_bytes / MB:,.0f} MB of buckets, {available / MB:,.0f} MB "
                     "available memory: the page cache may not hold them and reads will hit the disk")
    stderr.print(f"warming the page cache ({file_bytes / MB:,.0f} MB)")
    warm_page_cache(files)

    jobs = [Job("baseline", f"h5py read_direct of rel/lhs/rhs, {args.block:,} elements per read", [])]
    skipped = validate_unavailable()
    if skipped is None:
        jobs.append(Job("validate", "pbgio.validate.validate_path(config, base=data)", []))
        if not args.no_cli:
            jobs.append(Job("cli", f"{cli_label()} validate config.json --base DATA --no-progress "
                                   "(whole process: start, imports, exit)", []))
    else:
        print(f"skipped validate and cli: {skipped}")

    for i in range(args.repeat):  # interleaved, so drift hits every job alike
        for job in jobs:
            run = run_job(job, data_dir, files, args.block)
            job.runs.append(run)
            if job.good(run):
                stderr.print(f"{job.name} run {i + 1}/{args.repeat}: {run.seconds:.3f} s, "
                             f"{nbytes / run.seconds / MB:,.0f} MB/s, "
                             f"peak RSS {run.peak_rss_bytes / MB:,.0f} MB")
            else:
                stderr.print(f"[red]{job.name} run {i + 1}/{args.repeat} failed:[/] {run.failure()}")

    summaries: list[dict[str, Any]] = []
    for job in jobs:
        summaries.append(summarize(job, nbytes, summaries[0] if summaries else None))

    print(f"data: {data_dir}")
    print(f"bucket data: {nbytes:,} bytes ({nbytes / MB:,.1f} MB of rel/lhs/rhs; {file_bytes / MB:,.1f} MB "
          f"of files), {edges:,} edges in {len(files)} buckets, {spec.relations} relations")
    print(f"throughput in MB/s of bucket data (1 MB = 10^6 bytes); best and median of {args.repeat} runs; "
          "'x baseline' = MB/s / baseline MB/s; peak RSS = VmHWM of the child process")
    print_table(summaries)
    for s in summaries:
        if s["job"] == "validate" and "report" in s:
            rep = s["report"]
            print(f"validate report: ok={rep['ok']}, {rep['issues']} issue(s) ({rep['errors']} errors, "
                  f"{rep['warnings']} warnings), checked {rep['checked']}")
            for line in rep["first_issues"]:
                print(f"  {line}")
        if s["job"] == "cli" and "exit_code" in s:
            print(f"cli: exit {s['exit_code']}: {s['stderr_tail']}")

    if args.json is not None:
        write_json(args.json, {
            "benchmark": "validate",
            "data_dir": str(data_dir),
            "dataset": {**asdict(spec), "buckets": len(files), "bucket_data_bytes": nbytes,
                        "file_bytes": file_bytes, "edges_read": edges},
            "generation_seconds": generation_seconds,
            "dataset_reused": reused,
            "read_block_elements": args.block,
            "repeat": args.repeat,
            "skipped": skipped,
            "jobs": summaries,
            "environment": environment(),
        })
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
