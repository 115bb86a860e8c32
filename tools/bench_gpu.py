"""``pbgtrain fit`` on one GPU (and the same shapes on a CPU): throughput, memory, roofline, quality.

Scenarios (``--scenario``, repeatable; default: the three GPU ones where CUDA is present, else
``cpu-partitioned``):

1. ``livejournal``: the original's GPU benchmark shape on a planted graph (4.8M entities, 68M
   edges, one partition, one relation, operator none, dimension 100, dot, softmax, lr 0.1, batch
   10,000, 1,000 same-batch + 1,000 uniform negatives), for each ``--precision``: edges/s per
   epoch, peak GPU memory, and the share of the arithmetic roofline reached (``12·d·N`` FLOPs per
   edge, N = negatives per side, against the card's peak for that precision: H100/H200 fp32 67,
   tf32 495, bf16 989 dense TFLOP/s, or ``--peak-tflops``). The original measured 1.26M edges/s on
   one H100; the target is 20M.
2. ``fb15k``: FB15k-237 with the reference configuration (tools/bench_train.py) on the device, each
   precision: seconds per epoch and filtered test MRR after 6 epochs (the original: 0.2832).
3. ``oversize``: 8 partitions whose embeddings + Adagrad state hold ``--oversize-factor`` × the card's
   memory (clamped to 40% of host memory and to the free disk): edges/s, time spent swapping, bytes
   moved, partitions kept on the GPU.
4. ``cpu-partitioned``: the step-efficiency case of the CPU path (10M entities, 20M edges, 8
   partitions, the livejournal model), ``--device cpu``; edges/s and peak RSS.
5. ``freebase``: a graph of Freebase86m's shape (86M entities, 338M edges, 14,824 relations;
   ComplEx d100, dot, softmax, batch 10,000, ``--freebase-negatives`` same-batch + uniform
   negatives, one partition: row Adagrad keeps one float of state per row, so the 34 GB table
   fits an 80 GB card) through the whole pipeline, each stage a fresh process timed with its
   peak memory: generate the edge list (planted communities, power-law degrees; TSV), ``pbgio
   import`` (train + 0.1% test), ``pbgtrain fit`` (``--freebase-epochs``), ``pbgtrain eval`` on the
   test edges (sampled candidates), ``pbgio export`` (npy), ``pbgio index build`` (IVF; skipped
   without FAISS). ``--scale 0.05 --device cpu`` is the 1/20-size run of a development machine.

Beside each training figure, a fresh run of one edge chunk of about ``--profile-batches`` batches
under ``torch.profiler`` gives the share of its wall time the GPU was busy (kernel time over
wall time), kernel launches per batch (on a CPU: aten operations per batch) and the host's CPU
time per batch (the profiler's own cost included: compare runs, not absolutes).

Sizes scale with ``--scale`` (entities and edges; 0.01 makes every scenario a smoke run). Each run
is a fresh child process training from scratch (inputs not validated, ``eval_fraction`` 0). Figures
are printed, never asserted. Without CUDA the GPU scenarios print "skipped" and exit 0.

    .venv/bin/python tools/bench_gpu.py                                  # on a GPU machine
    .venv/bin/python tools/bench_gpu.py --scenario livejournal --precision tf32 --epochs 2
    .venv/bin/python tools/bench_gpu.py --scenario livejournal --compile     # torch.compile'd passes
    .venv/bin/python tools/bench_gpu.py --scenario cpu-partitioned --edges 2e6   # CPU, shorter
    .venv/bin/python tools/bench_gpu.py --scenario freebase --scale 0.05 --device cpu --precision fp32 \
        --freebase-epochs 1 --workdir bench-data/gpu          # the 1/20-size pipeline on a CPU

``--check`` prints every GPU line of the fused, captured step with its target (``tools/gpu_check.py``):
the LiveJournal shape at batch 10,000 and 50,000, Freebase86m's shape, FB15k-237 1-vs-all at
dimension 2,000 and a partitioned fit with read-ahead, each with its peak GPU memory and its
run's notes (a capture that failed says so there). On a card it is one stage of
``tools/card_run.py``, which installs what a torch-only image lacks from the card kit
(``tools/card_kit.py prepare``, on a CPU machine: wheels and the FB15k-237 layout) and runs
``pytest -m gpu`` first (docs/guides/gpu.md, "Checking a card"):

    .venv/bin/python tools/card_kit.py prepare card-kit                  # on a CPU machine
    python3 tools/card_run.py --kit card-kit                             # on the card
    .venv/bin/python tools/card_run.py --kit card-kit --device cpu --no-install   # its CPU dry run (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _benchutil import CHILD_PROLOGUE, REPO_ROOT, ChildRun, environment, format_table, run_python, write_json

GIB = 1 << 30
ORIGINAL_LIVEJOURNAL_EDGES_PER_S = 1_260_000
ORIGINAL_FB15K_MRR = 0.2832
PEAK_TFLOPS = {"fp32": 67.0, "tf32": 495.0, "bf16": 989.0}  # H100 SXM / H200, dense
MODEL = ["dimension=100", "relations.0.operator=none", "comparator=dot", "loss_fn=softmax", "lr=0.1",
         "batch_size=10000", "num_batch_negs=1000", "num_uniform_negs=1000", "eval_fraction=0", "verbose=0",
         "regularization_coef=0", "global_emb=false"]

CHILD = CHILD_PROLOGUE + r"""
import torch
from pathlib import Path
from pbgtrain.config import load_run_config
from pbgtrain.train import FitOptions, fit

run = load_run_config(Path(ARGS["config"]), ARGS["overrides"])
device = ARGS["device"]
if device.startswith("cuda"):
    torch.cuda.reset_peak_memory_stats()
result = fit(run, FitOptions(device=device, precision=ARGS["precision"], check_layout=False,
                             partition_memory=ARGS["partition_memory"], compile=ARGS["compile"]))
peak_gpu_bytes = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
profiled = None
if ARGS["profile_batches"] and result.iterations:
    # A fresh run of one edge chunk of about profile_batches batches under the profiler: where the
    # host's time goes per batch, how many kernels it launches, how busy the device is.
    import math, tempfile, time
    from torch.profiler import ProfilerActivity, profile
    batch_size = run.config.batch_size
    chunks = max(1, math.ceil(result.iterations[0].train.count / (batch_size * ARGS["profile_batches"])))
    scratch = tempfile.mkdtemp(prefix="profiled-", dir=Path(ARGS["config"]).parent)
    again = load_run_config(Path(ARGS["config"]), [*ARGS["overrides"], f"checkpoint_path={scratch}",
                                                   f"num_edge_chunks={chunks}"])
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        one = fit(again, FitOptions(device=device, precision=ARGS["precision"], check_layout=False, max_iterations=1,
                                    partition_memory=ARGS["partition_memory"], compile=ARGS["compile"]))
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - started
    batches = max(1, math.ceil(one.iterations[0].train.count / batch_size))
    events = prof.events()
    launch_names = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"}
    launches = sum(e.name in launch_names for e in events) if cuda else sum(e.name.startswith("aten::") for e in events)
    busy = None
    if cuda:
        from torch.autograd import DeviceType
        busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6 / wall
    host = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
    profiled = {"batches": batches, "wall_seconds": wall, "launches_per_batch": launches / batches,
                "launches_are": "CUDA kernel launches" if cuda else "aten operations",
                "host_ms_per_batch": 1e3 * host / batches, "device_busy_share": busy}
    import shutil
    shutil.rmtree(scratch, ignore_errors=True)
emit(iterations=[{"seconds": r.seconds, "edges": r.train.count, "loss": r.train.loss / max(r.train.count, 1)}
                 for r in result.iterations],
     movement=result.movement[0], peak_gpu_bytes=peak_gpu_bytes, profiled=profiled,
     gpu=torch.cuda.get_device_name() if device.startswith("cuda") else None)
"""


def profile_cells(run: ChildRun) -> list[str]:
    """Device busy share, launches per batch and host ms per batch of the run's profiled chunk."""
    p = run.result.get("profiled")
    if not p:
        return ["-", "-", "-"]
    busy = "-" if p["device_busy_share"] is None else f"{100 * p['device_busy_share']:.0f}%"
    return [busy, f"{p['launches_per_batch']:.0f}", f"{p['host_ms_per_batch']:.2f}"]


PROFILE_HEADER = ["device busy", "launches/batch", "host ms/batch"]


def graph(workdir: Path, *, nodes: int, edges: int, partitions: int, seed: int) -> Path:
    """A planted graph with one relation (reused when made with the same parameters)."""
    from pbgio.testing.planted import planted_graph

    params = {"nodes": nodes, "edges": edges, "partitions": partitions, "seed": seed}
    marker = workdir / "bench-params.json"
    config = workdir / "config.json"
    if config.is_file() and marker.is_file() and json.loads(marker.read_text()) == params:
        return config
    shutil.rmtree(workdir, ignore_errors=True)
    config = planted_graph(workdir, num_partitions=partitions, num_nodes=nodes, num_edges=edges, num_relations=1,
                           num_communities=1000, seed=seed)
    marker.write_text(json.dumps(params), encoding="utf-8")
    return config


def train(config: Path, *, device: str, precision: str, epochs: int, compile_step: bool,
          partition_memory: float | None = None, extra: list[str] | None = None,
          profile_batches: int = 0) -> ChildRun:
    shutil.rmtree(config.parent / "checkpoint", ignore_errors=True)
    overrides = [*MODEL, f"num_epochs={epochs}", "num_edge_chunks=1", *(extra or [])]
    run = run_python(CHILD, {"config": str(config), "overrides": overrides, "device": device,
                             "precision": precision, "partition_memory": partition_memory,
                             "compile": compile_step, "profile_batches": profile_batches})
    if run.result is None:
        sys.exit(f"training failed (exit {run.returncode}): {run.failure()}")
    return run


def epoch_rates(run: ChildRun) -> list[float]:
    return [it["edges"] / it["seconds"] for it in run.result["iterations"]]


def roofline_share(edges_per_s: float, precision: str, peak_tflops: float | None, gpu: str | None) -> float | None:
    flops_per_edge = 12 * 100 * 2000  # 12·d·N, d = 100, N = 1,000 batch + 1,000 uniform negatives per side
    peak = peak_tflops or (PEAK_TFLOPS[precision] if gpu and ("H100" in gpu or "H200" in gpu) else None)
    return None if peak is None else edges_per_s * flops_per_edge / (peak * 1e12)


def livejournal(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    config = graph(work / "livejournal", nodes=int(4_800_000 * args.scale), edges=int(68_000_000 * args.scale),
                   partitions=1, seed=args.seed)
    rows, raw = [], []
    for precision in args.precision:
        run = train(config, device=args.device, precision=precision, epochs=args.epochs, compile_step=args.compile,
                    profile_batches=args.profile_batches)
        raw.append({"precision": precision, **run.result, "peak_rss_bytes": run.peak_rss_bytes})
        rates = epoch_rates(run)
        best = max(rates)
        share = roofline_share(best, precision, args.peak_tflops, run.result["gpu"])
        rows.append([precision, " / ".join(f"{r / 1e6:.2f}M" for r in rates),
                     f"{best / ORIGINAL_LIVEJOURNAL_EDGES_PER_S:.1f}x",
                     f"{(run.result['peak_gpu_bytes'] or 0) / GIB:.1f}",
                     "-" if share is None else f"{100 * share:.1f}%",
                     f"{run.result['iterations'][-1]['loss']:.4f}", *profile_cells(run)])
    print(format_table(["precision", "edges/s per epoch", "x original (1.26M)", "peak GPU GiB", "roofline",
                        "last loss", *PROFILE_HEADER], rows))
    return {"rows": rows, "runs": raw}


def fb15k(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bench_train import train_and_evaluate

    rows, raw = [], []
    for precision in args.precision:
        run = train_and_evaluate(REPO_ROOT / "bench-data" / "train-fb15k237", epochs=6, device=args.device,
                                 precision=precision, seed=args.seed)
        raw.append({"precision": precision, **run.result})
        epochs = run.result["epochs"]
        mrr = run.result["evals"][-1]["mrr"]
        rows.append([precision, f"{sum(e['seconds'] for e in epochs) / len(epochs):.2f}",
                     f"{run.result['train_seconds']:.1f}", f"{mrr:.4f}", f"{mrr - ORIGINAL_FB15K_MRR:+.4f}"])
    print(format_table(["precision", "s/epoch", "training s (6 epochs)", "filtered MRR", "vs original 0.2832"], rows))
    return {"rows": rows, "runs": raw}


def oversize(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    card = torch.cuda.get_device_properties(0).total_memory
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    disk = shutil.disk_usage(work).free
    target = min(args.oversize_factor * card, 0.4 * host, 0.4 * disk)
    nodes = int(target / (4 * 101) * args.scale)
    config = graph(work / "oversize", nodes=nodes, edges=int(args.edges * args.scale), partitions=8, seed=args.seed)
    run = train(config, device=args.device, precision=args.precision[0], epochs=1, compile_step=args.compile,
                profile_batches=args.profile_batches)
    it, moved = run.result["iterations"][0], run.result["movement"]
    table_gib = nodes * 404 / GIB
    rows = [[f"{nodes:,}", f"{table_gib:.1f} ({table_gib * GIB / card:.2f}x card)",
             f"{it['edges'] / it['seconds']:,.0f}",
             f"{it['seconds']:.1f}", f"{moved['seconds_swapping']:.1f}",
             f"{(moved['bytes_saved'] + moved['bytes_loaded']) / GIB:.1f}", str(moved["partitions_kept_in_memory"]),
             f"{(run.result['peak_gpu_bytes'] or 0) / GIB:.1f}", *profile_cells(run)]]
    print(format_table(["entities", "embeddings + state GiB", "edges/s", "epoch s", "swapping s", "GiB moved",
                        "kept on GPU", "peak GPU GiB", *PROFILE_HEADER], rows))
    return {"rows": rows, "runs": [{**run.result, "entities": nodes, "card_bytes": card}]}


def cpu_partitioned(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    config = graph(work / "cpu-partitioned", nodes=int(10_000_000 * args.scale), edges=int(args.edges * args.scale),
                   partitions=8, seed=args.seed)
    run = train(config, device="cpu", precision="fp32", epochs=1, compile_step=args.compile,
                profile_batches=args.profile_batches)
    it, moved = run.result["iterations"][0], run.result["movement"]
    rate = it["edges"] / it["seconds"]
    rows = [[f"{it['edges']:,}", f"{it['seconds']:.1f}", f"{rate:,.0f}", f"{rate * 12 * 100 * 2000 / 1e9:.0f}",
             f"{moved['seconds_swapping']:.1f}", f"{(moved['bytes_saved'] + moved['bytes_loaded']) / GIB:.1f}",
             f"{run.peak_rss_bytes / GIB:.2f}", *profile_cells(run)]]
    print(format_table(["edges", "epoch s", "edges/s", "GFLOP/s", "swapping s", "GiB moved", "peak RSS GiB",
                        *PROFILE_HEADER], rows))
    return {"rows": rows, "runs": [{**run.result, "peak_rss_bytes": run.peak_rss_bytes}]}


FREEBASE = {"entities": 86_054_151, "edges": 338_586_276, "relations": 14_824}  # Freebase86m (Marius, PBG)


def planted_edge_list(path: Path, *, entities: int, edges: int, relations: int, seed: int,
                      communities: int = 1000, affinity: float = 0.8) -> None:
    """``edges`` lines ``n{lhs}\tr{rel}\tn{rhs}``: lhs power-law, rhs from the lhs's community
    (entity id mod ``communities``) with probability ``affinity``, else anywhere."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    tmp = path.with_name(path.name + ".partial")
    written = 0
    with tmp.open("wb") as out:
        while written < edges:
            n = min(5_000_000, edges - written)
            lhs = np.minimum((entities * rng.random(n) ** 2).astype(np.int64), entities - 1)
            same = lhs % communities + communities * rng.integers(0, max(entities // communities, 1), n)
            rhs = np.where(rng.random(n) < affinity, np.minimum(same, entities - 1), rng.integers(0, entities, n))
            rel = rng.integers(0, relations, n)
            pl.DataFrame({"l": lhs, "r": rel, "h": rhs}).select(
                pl.format("n{}", "l"), pl.format("r{}", "r"), pl.format("n{}", "h")).write_csv(
                out, separator="\t", include_header=False, quote_style="never")
            written += n
    tmp.replace(path)


def stage(name: str, module: str, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m module argv`` in ``cwd``: its wall seconds and peak RSS (exit on failure)."""
    from _benchutil import run_python_module

    run = run_python_module(module, argv, cwd=cwd, env=env)
    if run.returncode != 0:
        sys.exit(f"freebase: {name} failed: {run.failure()}")
    print(f"  {name}: {run.wall_seconds:.1f} s, peak RSS {run.peak_rss_bytes / GIB:.2f} GiB", flush=True)
    return {"stage": name, "seconds": run.wall_seconds, "peak_rss_bytes": run.peak_rss_bytes, "stdout": run.stdout,
            "stderr": run.stderr}


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def freebase_config(args: argparse.Namespace) -> dict[str, Any]:
    """The scenario's config: ComplEx d100 over dynamic relations, ``--freebase-partitions``
    partitions, each bucket in ``--freebase-edge-chunks`` chunks (``fit`` trains
    ``--freebase-iterations`` of them: that share of an epoch)."""
    negs = args.freebase_negatives
    return {
        "entities": {"entity": {"num_partitions": args.freebase_partitions}},
        "relations": [{"name": "rel", "lhs": "entity", "rhs": "entity", "operator": "complex_diagonal"}],
        "dynamic_relations": True, "dimension": 100, "comparator": "dot", "loss_fn": "softmax", "lr": 0.1,
        "global_emb": False, "regularization_coef": 0.0, "batch_size": 10_000, "num_batch_negs": negs,
        "num_uniform_negs": negs, "eval_fraction": 0.0, "num_epochs": args.freebase_epochs,
        "num_edge_chunks": args.freebase_edge_chunks, "verbose": 0,
        "entity_path": "data", "edge_paths": ["data/train", "data/test"], "checkpoint_path": "model"}


def freebase(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import time

    entities = int(FREEBASE["entities"] * args.scale)
    edges = int(FREEBASE["edges"] * args.scale)
    relations = max(1, int(FREEBASE["relations"] * args.scale))
    root = work / "freebase"
    root.mkdir(parents=True, exist_ok=True)
    shape = {"entities": entities, "edges": edges, "relations": relations, "seed": args.seed}
    marker = root / "shape.json"
    stages: list[dict[str, Any]] = []
    if not (marker.is_file() and json.loads(marker.read_text()) == shape):
        started = time.perf_counter()
        planted_edge_list(root / "train.tsv", entities=entities, edges=edges, relations=relations, seed=args.seed)
        planted_edge_list(root / "test.tsv", entities=entities, edges=max(edges // 1000, 1000), relations=relations,
                          seed=args.seed + 1)
        marker.write_text(json.dumps(shape), encoding="utf-8")
        stages.append({"stage": "generate (TSV)", "seconds": time.perf_counter() - started, "peak_rss_bytes": None})
    (root / "config.json").write_text(json.dumps(freebase_config(args), indent=4), encoding="utf-8")
    for leftover in ("data", "model", "export"):
        shutil.rmtree(root / leftover, ignore_errors=True)
    cli = ["--no-progress"]
    stages.append(stage("import", "pbgio", ["import", "config.json", "train.tsv", "test.tsv", *cli], root))
    stages.append(stage("validate", "pbgio", ["validate", "config.json"], root))
    # The planted relations are random labels over one community structure, so identity operators are
    # this graph's truth: started random (fit's default), 741 of them at 1/20 learn nothing in one
    # epoch (test MRR .0041, chance; identity: .0112). Identity keeps the scenario's figures comparable.
    limit = ["--max-iterations", str(args.freebase_iterations)] if args.freebase_iterations else []
    fitted = stage("fit", "pbgtrain", ["fit", "config.json", "-p", "edge_paths=data/train", "--device",
                                       args.device, "--precision", args.precision[0], "--no-validate",
                                       "--operator-init", "identity", *limit, *cli], root)
    stages.append(fitted)
    stages.append(stage("eval", "pbgtrain", ["eval", "config.json", "--edges", "data/test", "--device", args.device,
                                             "--json", *cli], root))
    for fmt, target in (("npy", "export"), ("parquet", "export"), ("tsv", "export/embeddings.tsv")):
        done = stage(f"export {fmt}", "pbgio", ["export", "config.json", "-o", target, "--format", fmt, *cli], root)
        done["output_bytes"] = _bytes_under(root / target)
        stages.append(done)
        shutil.rmtree(root / "export", ignore_errors=True)  # each format's files go before the next's come
    try:
        import faiss  # noqa: F401
    except ImportError:
        stages.append({"stage": "index build", "seconds": None, "peak_rss_bytes": None,
                       "skipped": "FAISS is not installed"})
    else:
        built = stage("index build", "pbgio", ["index", "build", "config.json", "-t", "entity", *cli], root)
        built["output_bytes"] = sum(p.stat().st_size for p in (root / "model").glob("index_entity.*"))
        stages.append(built)
        stages.append(stage("neighbours (index)", "pbgio", ["neighbors", "config.json", "-t", "entity", "n0", "n1",
                                                            "--metric", "dot", "--index", "-k", "10", "--json"], root))
        stages.append(stage("predict (index)", "pbgtrain", ["predict", "config.json", "--lhs", "n0", "--rel", "r0",
                                                            "--index", "-k", "10", "--json"], root))
    stats = [json.loads(line) for line in (root / "model" / "training_stats.json").read_text().splitlines()]
    trained = [line for line in stats if "stats" in line and "pbgtrain" in line]
    train_seconds = sum(line["pbgtrain"]["trained_until"] - line["pbgtrain"]["trained_from"] for line in trained)
    train_edges = sum(line["stats"]["count"] for line in trained)
    said = (fitted["stdout"] + fitted["stderr"]).splitlines()
    memory_line = next((line[line.index("memory:"):] for line in said if "memory:" in line), None)
    rows = [[s["stage"], "-" if s["seconds"] is None else f"{s['seconds']:.1f}",
             "-" if s["peak_rss_bytes"] is None else f"{s['peak_rss_bytes'] / GIB:.2f}",
             f"{s['output_bytes'] / GIB:.2f}" if "output_bytes" in s else "", s.get("skipped", "")]
            for s in stages]
    share = (f"{args.freebase_iterations} of {args.freebase_edge_chunks} edge chunks" if args.freebase_iterations
             else f"{args.freebase_epochs} epoch(s)")
    print(f"{entities:,} entities, {edges:,} training edges, {relations:,} relations, {args.freebase_partitions} "
          f"partitions; ComplEx d100, {args.freebase_negatives} + {args.freebase_negatives} negatives, {share} on "
          f"{args.device} ({args.precision[0]}): {train_edges:,} edges at "
          f"{train_edges / max(train_seconds, 1e-9):,.0f} edges/s of training")
    if memory_line:
        print(f"fit's first line: {memory_line}")
    print(format_table(["stage", "seconds", "peak RSS GiB", "output GiB", ""], rows))
    evaluated = next(s for s in stages if s["stage"] == "eval")["stdout"]
    report = json.loads(evaluated[evaluated.index("{"):evaluated.rindex("}") + 1])
    m = report["metrics"]
    print(f"test ({report['count']:,} edges, {report['protocol']}): MRR {m['mrr']:.4f}, Hits@10 {m['r10']:.4f}")
    for s in stages:
        s.pop("stdout", None)
        s.pop("stderr", None)
    return {"shape": shape, "partitions": args.freebase_partitions, "stages": stages, "train_edges": train_edges,
            "train_edges_per_s": train_edges / max(train_seconds, 1e-9), "memory_rule": memory_line, "test": report}


def side_by_side(paths: list[Path]) -> None:
    """The freebase stages of several ``--json`` results (e.g. 1/20 and 1/4, or two commits) in one table."""
    results = [json.loads(p.read_text())["results"]["freebase"] for p in paths]
    names = list(dict.fromkeys(s["stage"] for r in results for s in r["stages"]))
    header = ["stage"]
    for path, r in zip(paths, results, strict=True):
        label = f"{path.stem} ({r['shape']['entities'] / 1e6:.1f}M)"
        header += [f"{label} s", f"{label} GiB"]
    rows = []
    for name in names:
        row = [name]
        for r in results:
            found = next((s for s in r["stages"] if s["stage"] == name), None)
            seconds = None if found is None else found["seconds"]
            peak = None if found is None else found["peak_rss_bytes"]
            row += ["-" if seconds is None else f"{seconds:.1f}", "-" if peak is None else f"{peak / GIB:.2f}"]
        rows.append(row)
    print(format_table(header, rows))


SCENARIOS = {"livejournal": livejournal, "fb15k": fb15k, "oversize": oversize, "cpu-partitioned": cpu_partitioned,
             "freebase": freebase}
GPU_SCENARIOS = ("livejournal", "fb15k", "oversize")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), default=None)
    parser.add_argument("--device", default="cuda", help="the GPU scenarios' device")
    parser.add_argument("--precision", action="append", choices=["fp32", "tf32", "bf16"], default=None,
                        help="repeatable (default: fp32, tf32, bf16; oversize uses the first)")
    parser.add_argument("--epochs", type=int, default=2, help="livejournal epochs (each is reported)")
    parser.add_argument("--edges", type=lambda s: int(float(s)), default=20_000_000,
                        help="edges of the oversize and cpu-partitioned graphs")
    parser.add_argument("--oversize-factor", type=float, default=1.5)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies entities and edges")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the card's peak (default: H100/H200's)")
    parser.add_argument("--compile", action="store_true", help="train with --compile (torch.compile'd passes)")
    parser.add_argument("--profile-batches", type=int, default=50,
                        help="profile a fresh run of about this many batches (0: none): device busy share, kernel "
                             "launches (on a CPU: aten operations) and host ms per batch")
    parser.add_argument("--freebase-epochs", type=int, default=10)
    parser.add_argument("--freebase-partitions", type=int, default=1,
                        help="partitions of the entity type (8: the bounded-memory run of docs/guides/scaling.md)")
    parser.add_argument("--freebase-edge-chunks", type=int, default=1, help="num_edge_chunks of the config")
    parser.add_argument("--freebase-iterations", type=int, default=0,
                        help="fit stops after this many edge chunks (0: every epoch); with --freebase-edge-chunks "
                             "20, 1 trains a 20th of an epoch over every bucket")
    parser.add_argument("--freebase-negatives", type=int, default=500, help="same-batch and uniform, each")
    parser.add_argument("--check", action="store_true",
                        help="the GPU lines with their targets, peak memory and notes (tools/gpu_check.py)")
    parser.add_argument("--prepare-check", type=Path, default=None, metavar="DIR",
                        help="import what --check needs (FB15k-237, with polars) into DIR, on a CPU machine "
                             "(tools/card_kit.py prepare does it too, into DIR/layouts)")
    parser.add_argument("--prepared", type=Path, default=None, metavar="DIR",
                        help="--check: what --prepare-check made (a card kit's layouts/)")
    parser.add_argument("--check-seconds", type=float, default=20.0, help="--check: seconds each step rate is measured")
    parser.add_argument("--check-fb15k-minutes", type=float, default=2.5,
                        help="--check: minutes of FB15k-237 training; the MRR target (.37 within 10 minutes) is "
                             "judged at that minute: met if reached by then, undecided if not before 10")
    parser.add_argument("--check-fb15k-dimension", type=int, default=2000, help="--check: FB15k-237's dimension")
    parser.add_argument("--check-fb15k-batch", type=int, default=1000, help="--check: FB15k-237's batch size")
    parser.add_argument("--check-fb15k-edge-chunks", type=int, default=1,
                        help="--check: FB15k-237's num_edge_chunks (fit stops between chunks: a smoke run's many "
                             "chunks stop it within its minutes)")
    parser.add_argument("--check-fb15k-eval-sample", type=int, default=0,
                        help="--check: rank a sample of this many FB15k-237 test edges (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None, help="keep (and reuse) the graphs here")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--side-by-side", type=Path, nargs="+", default=None, metavar="JSON",
                        help="print the freebase stages of these --json results side by side, and exit")
    args = parser.parse_args()
    if args.side_by_side:
        side_by_side(args.side_by_side)
        return
    args.precision = args.precision or ["fp32", "tf32", "bf16"]
    if args.prepare_check is not None:
        from gpu_check import prepare

        print(f"prepared: {prepare(args.prepare_check)}")
        return
    if args.check:
        from gpu_check import run

        if args.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                sys.exit("--check: no CUDA device here (--device cpu runs it as a smoke run)")
        run(args)
        return

    import torch

    cuda = torch.cuda.is_available()
    scenarios = args.scenario or (list(GPU_SCENARIOS) if cuda else ["cpu-partitioned"])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    results: dict[str, Any] = {}
    try:
        for name in scenarios:
            if name in GPU_SCENARIOS and not cuda:
                print(f"{name}: skipped: no CUDA device here")
                continue
            print(f"\n== {name}", flush=True)
            results[name] = SCENARIOS[name](args, work)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        write_json(args.json, {"environment": environment(), "arguments": {k: str(v) for k, v in vars(args).items()},
                               "results": results})


if __name__ == "__main__":
    main()
