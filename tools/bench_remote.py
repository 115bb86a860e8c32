"""Validate and train on a real S3 server (moto in server mode on localhost) vs local disk.

The same planted layout (``--edges``, default 10M) is validated and trained on twice: from local
disk, and from the S3 server after an upload, each command in a fresh ``pbgio`` / ``pbgtrain``
process (the server runs in this process, so both share this machine's cores). Prints wall times,
throughputs, the remote/local ratio, and the bytes that went over HTTP against the layout's size.

    python tools/bench_remote.py                       # 10M edges
    python tools/bench_remote.py --edges 1000000 --json out.json

Training runs ``--iterations`` iterations of a ``--chunks``-chunk epoch (the first touches
every bucket: a remote bucket is fetched whole into the local cache, then read locally).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchutil import MB

from pbgio import storage
from pbgio.testing.planted import planted_graph
from pbgio.testing.s3server import S3Server


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def measure(config: str, edges_to_train: int, args: argparse.Namespace, env: dict[str, str],
            server: S3Server | None) -> dict[str, Any]:
    before = (server.bytes_sent, server.bytes_received) if server else (0, 0)
    validate_s = timed([sys.executable, "-m", "pbgio", "validate", config, "--no-progress"], env)
    mid = (server.bytes_sent, server.bytes_received) if server else (0, 0)
    fit_s = timed([sys.executable, "-m", "pbgtrain", "fit", config, "--no-progress", "-p", "num_epochs=1",
                   "-p", f"num_edge_chunks={args.chunks}", "--max-iterations", str(args.iterations)], env)
    after = (server.bytes_sent, server.bytes_received) if server else (0, 0)
    return {"validate_seconds": validate_s, "validate_edges_per_second": args.edges / validate_s,
            "validate_bytes_down": mid[0] - before[0],
            "fit_seconds": fit_s, "fit_edges_per_second": edges_to_train / fit_s,
            "fit_bytes_down": after[0] - mid[0], "fit_bytes_up": after[1] - mid[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edges", type=int, default=10_000_000)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--json", type=Path, help="Write the figures here too.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as scratch:
        run_benchmark(args, Path(scratch))


def run_benchmark(args: argparse.Namespace, work: Path) -> None:
    print(f"writing a planted graph of {args.edges:,} edges under {work} …", flush=True)
    config = planted_graph(work / "layout", num_partitions=args.partitions, num_nodes=args.nodes,
                           num_edges=args.edges, dimension=32)
    layout_bytes = tree_bytes(work / "layout")
    edges_to_train = args.edges * args.iterations // args.chunks
    env = {**os.environ, storage.TIMEOUT_ENV: "120"}
    local = measure(str(config), edges_to_train, args, env, None)
    print(f"local: validate {local['validate_seconds']:.1f} s, fit {local['fit_seconds']:.1f} s", flush=True)
    with S3Server(bucket="bench") as server:
        env.update(server.env())
        root = server.url("layout")
        # The same layout on the store, fresh: no checkpoint yet.
        for sub in ("entities", "edges"):
            storage.copy_tree(work / "layout" / sub, storage.resolve(f"{root}/{sub}"))
        storage.copy_file(config, storage.resolve(f"{root}/config.json"))
        uploaded = server.bytes_received
        remote = measure(f"{root}/config.json", edges_to_train, args, env, server)
    figures = {
        "machine": platform.platform(), "cpus": os.cpu_count(), "edges": args.edges, "nodes": args.nodes,
        "partitions": args.partitions,
        "layout_bytes": layout_bytes, "upload_bytes": uploaded, "edges_trained": edges_to_train,
        "local": local, "remote": remote,
        "validate_ratio": remote["validate_edges_per_second"] / local["validate_edges_per_second"],
        "fit_ratio": remote["fit_edges_per_second"] / local["fit_edges_per_second"],
    }
    print(f"layout {layout_bytes / MB:,.1f} MB ({args.edges:,} edges, {args.partitions} partitions)")
    for what in ("validate", "fit"):
        print(f"{what:8s} local {local[f'{what}_seconds']:7.1f} s ({local[f'{what}_edges_per_second']:,.0f} "
              f"edges/s)   s3 {remote[f'{what}_seconds']:7.1f} s ({remote[f'{what}_edges_per_second']:,.0f} "
              f"edges/s)   s3/local throughput {figures[f'{what}_ratio']:.2f}")
    print(f"bytes over HTTP: validate read {remote['validate_bytes_down'] / MB:,.1f} MB "
          f"({remote['validate_bytes_down'] / layout_bytes:.2f}x the layout); fit read "
          f"{remote['fit_bytes_down'] / MB:,.1f} MB ({remote['fit_bytes_down'] / layout_bytes:.2f}x), "
          f"wrote {remote['fit_bytes_up'] / MB:,.1f} MB")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
