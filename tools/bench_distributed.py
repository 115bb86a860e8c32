"""Distributed ``pbgtrain fit`` on one machine: 1, 2 and 4 trainers on a synthetic partitioned graph.

The graph is :func:`pbgio.testing.planted.planted_graph` (one entity type in ``--partitions``
partitions, ``--edges`` edges, ``--nodes`` nodes, dimension ``--dimension``, batch 1000, 50 batch +
50 uniform negatives), trained ``--epochs`` epochs from scratch for each trainer count (checkpoint
removed before each run; ``hogwild_delay=0``, ``eval_fraction=0``, ``verbose=0``; inputs not
validated). One trainer is the single-process path (no torch.distributed): the baseline. ``N > 1``
trainers are ``N`` processes started together with torchrun's environment (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` on a free port, ``LOCAL_WORLD_SIZE=N``); trainers on
one host split its cores, ``cores // N`` torch threads each (at least 1; ``--threads`` sets ``workers``). Each
trainer is a fresh child process that prints its figures (:mod:`_benchutil`); rank 0's
``FitResult`` has the whole run's edges and every rank's ``movement``.

Per trainer count: edges/s of the whole run (edges / rank 0's ``fit`` time, rendezvous and final
commit included) and the ratio to one trainer; partition bytes saved + loaded per epoch, summed
over ranks; the share of each rank's ``fit`` time spent asking and waiting for a bucket, averaged
over ranks; the shared-state all-reduce rounds and bytes (per rank); the peak RSS of the largest
rank. A second table has every rank. Figures are printed, never asserted; the machine may be
shared (the 1-minute load average before each run is shown), so compare runs taken back to back.

    .venv/bin/python tools/bench_distributed.py                       # 10M edges, 8 partitions, 1 epoch
    .venv/bin/python tools/bench_distributed.py --edges 1e6 --trainers 1 2 --json out.json
    .venv/bin/python tools/bench_distributed.py --workdir bench-data/distributed   # keep the graph
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _benchutil import CHILD_PROLOGUE, MB, ChildRun, environment, format_table, run_python, write_json

GIB = 1 << 30
LAUNCH_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS")

CHILD = CHILD_PROLOGUE + r"""
import os
from pathlib import Path
import torch
from pbgtrain.config import load_run_config
from pbgtrain.train import FitOptions, fit

run = load_run_config(Path(ARGS["config"]), ARGS["overrides"])
t0 = now()
result = fit(run, FitOptions(seed=ARGS["seed"], check_layout=False, peer_timeout=ARGS["peer_timeout"]))
figures = {"rank": int(os.environ.get("RANK", "0")), "fit_seconds": now() - t0, "threads": torch.get_num_threads()}
if figures["rank"] == 0:
    figures.update(edges=sum(r.train.count for r in result.iterations), movement=result.movement,
                   iteration_seconds=[r.seconds for r in result.iterations], final_version=result.final_version)
emit(**figures)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prepare(workdir: Path, args: argparse.Namespace) -> Path:
    """The planted graph under ``workdir`` (reused when it was made with the same parameters)."""
    from pbgio.testing.planted import planted_graph

    params = {"edges": args.edges, "partitions": args.partitions, "nodes": args.nodes, "seed": args.seed}
    marker = workdir / "bench-params.json"
    config = workdir / "config.json"
    if config.is_file() and marker.is_file() and json.loads(marker.read_text()) == params:
        return config
    shutil.rmtree(workdir / "edges", ignore_errors=True)
    shutil.rmtree(workdir / "entities", ignore_errors=True)
    config = planted_graph(workdir, num_partitions=args.partitions, num_nodes=args.nodes, num_edges=args.edges,
                           seed=args.seed)
    marker.write_text(json.dumps(params), encoding="utf-8")
    return config


def run_trainers(config: Path, trainers: int, args: argparse.Namespace) -> list[ChildRun]:
    """One run of ``trainers`` trainers from scratch; the children's runs, by rank."""
    shutil.rmtree(config.parent / "checkpoint", ignore_errors=True)
    overrides = [f"num_epochs={args.epochs}", f"dimension={args.dimension}", "batch_size=1000",
                 "hogwild_delay=0", "eval_fraction=0", "verbose=0", *args.param]
    if args.threads:
        overrides.append(f"workers={args.threads}")
    base = {k: v for k, v in os.environ.items() if k not in LAUNCH_KEYS}
    port = free_port()

    def env_of(rank: int) -> dict[str, str]:
        if trainers == 1:
            return base
        return {**base, "RANK": str(rank), "WORLD_SIZE": str(trainers), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(trainers), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}

    child_args = {"config": str(config), "overrides": overrides, "seed": args.seed,
                  "peer_timeout": args.peer_timeout}
    with ThreadPoolExecutor(trainers) as pool:
        runs = list(pool.map(lambda r: run_python(CHILD, child_args, env=env_of(r)), range(trainers)))
    failed = [(r, run) for r, run in enumerate(runs) if not run.ok]
    if failed:
        sys.exit("\n".join(f"{trainers} trainer(s), rank {r}: {run.failure()}" for r, run in failed))
    return runs


def summarize(trainers: int, runs: list[ChildRun], epochs: int, load: float) -> dict[str, Any]:
    """The figures of one trainer count (see the module)."""
    head = runs[0].result
    movement = {m["rank"]: m for m in head["movement"]}
    ranks = []
    for run in runs:
        rank = run.result["rank"]
        moved = movement.get(rank, {})
        ranks.append({**moved, "rank": rank, "fit_seconds": run.result["fit_seconds"],
                      "threads": run.result["threads"], "peak_rss_bytes": run.peak_rss_bytes,
                      "process_seconds": run.wall_seconds,
                      "wait_share": moved.get("seconds_waiting", 0.0) / run.result["fit_seconds"]})
    bytes_moved = sum(r.get("bytes_saved", 0) + r.get("bytes_loaded", 0) for r in ranks)
    partitions_moved = sum(r.get("partitions_saved", 0) + r.get("partitions_loaded", 0) for r in ranks)
    return {
        "trainers": trainers, "load_1m": load, "edges": head["edges"], "seconds": head["fit_seconds"],
        "edges_per_s": head["edges"] / head["fit_seconds"], "iteration_seconds": head["iteration_seconds"],
        "bytes_moved_per_epoch": bytes_moved / epochs, "partitions_moved_per_epoch": partitions_moved / epochs,
        "wait_share": sum(r["wait_share"] for r in ranks) / len(ranks),
        "sync_rounds": max(r.get("sync_rounds", 0) for r in ranks),
        "sync_bytes_per_rank": max(r.get("sync_bytes", 0) for r in ranks),
        "sync_seconds": max(r.get("sync_seconds", 0.0) for r in ranks),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks), "ranks": ranks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--edges", type=lambda s: int(float(s)), default=10_000_000, help="training edges (1e7 works)")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the one entity type")
    parser.add_argument("--nodes", type=lambda s: int(float(s)), default=1_000_000, help="entities")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per run")
    parser.add_argument("--dimension", type=int, default=64, help="embedding dimension")
    parser.add_argument("--trainers", type=int, nargs="+", default=[1, 2, 4], help="trainer counts to run")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per trainer (workers); default: cores // trainers")
    parser.add_argument("--seed", type=int, default=0, help="graph and training seed")
    parser.add_argument("--peer-timeout", type=float, default=None, help="default: the trainer's")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep (and reuse) the graph here; default: a temporary directory, removed")
    parser.add_argument("-p", "--param", action="append", default=[], help="config override key=value")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    import torch.distributed

    if any(n > 1 for n in args.trainers) and not torch.distributed.is_available():
        sys.exit("skipped: torch.distributed is unavailable in this torch build")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-distributed-"))
    try:
        config = prepare(workdir, args)
        results = []
        for trainers in args.trainers:
            load = os.getloadavg()[0]
            results.append(summarize(trainers, run_trainers(config, trainers, args), args.epochs, load))
            last = results[-1]
            print(f"{trainers} trainer(s): {last['edges']:,} edges in {last['seconds']:.1f} s", flush=True)
    finally:
        shutil.rmtree(workdir / "checkpoint", ignore_errors=True)
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    baseline = next((r["edges_per_s"] for r in results if r["trainers"] == 1), None)
    rows = [[str(r["trainers"]), str(r["ranks"][0]["threads"]), f"{r['seconds']:.1f}", f"{r['edges_per_s']:,.0f}",
             f"{r['edges_per_s'] / baseline:.2f}x" if baseline else "-", f"{r['partitions_moved_per_epoch']:.0f}",
             f"{r['bytes_moved_per_epoch'] / MB:,.0f}", f"{r['bytes_moved_per_epoch'] / GIB:.2f}",
             f"{100 * r['wait_share']:.1f}%", str(r["sync_rounds"]), f"{r['sync_bytes_per_rank'] / 1000:,.1f}",
             f"{r['peak_rss_bytes'] / GIB:.2f}", f"{r['load_1m']:.1f}"] for r in results]
    print(f"\n{args.edges:,} edges, {args.nodes:,} nodes in {args.partitions} partitions, dimension {args.dimension}, "
          f"{args.epochs} epoch(s), {os.cpu_count()} cores")
    print(format_table(["trainers", "threads each", "seconds", "edges/s", "x 1 trainer", "partitions moved/epoch",
                        "MB moved/epoch", "GiB", "waiting", "sync rounds", "sync kB/rank", "peak RSS GiB",
                        "load"], rows))
    rank_rows = [[str(r["trainers"]), str(k["rank"]), f"{k['fit_seconds']:.1f}", str(k.get("partitions_loaded", 0)),
                  str(k.get("partitions_saved", 0)),
                  f"{(k.get('bytes_loaded', 0) + k.get('bytes_saved', 0)) / MB:,.0f}", str(k.get("waits", 0)),
                  f"{k.get('seconds_waiting', 0.0):.1f}", f"{k.get('sync_seconds', 0.0):.2f}",
                  f"{k['peak_rss_bytes'] / GIB:.2f}"]
                 for r in results for k in r["ranks"]]
    print()
    print(format_table(["trainers", "rank", "fit s", "loaded", "saved", "MB moved", "waits", "waiting s",
                        "sync s", "peak RSS GiB"], rank_rows))
    if args.json:
        write_json(args.json, {"environment": environment(), "arguments": {k: str(v) for k, v in vars(args).items()},
                               "results": results})


if __name__ == "__main__":
    main()
