"""Suggestions for a mistyped entity name in a large type: time and peak RSS against the size of
the names files (``pbgio.names.close_names``, what an unknown name's error runs).

Writes ``--names`` names (``entity-0000000``… shuffled, in ``--partitions`` partitions) once into
``bench-data/names-<N>/`` (reused), then, in fresh child processes (peak RSS is the child's, the
interpreter included): the baseline (the imports alone) and ``close_names`` for a few typos.

    .venv/bin/python tools/bench_names.py --names 10000000
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _benchutil import CHILD_PROLOGUE, REPO_ROOT, format_table, run_python

WRITE = CHILD_PROLOGUE + r"""
import numpy as np
from pathlib import Path
from pbgio.entities import write_entity_names
root = Path(ARGS["root"]); n, parts = ARGS["names"], ARGS["partitions"]
order = np.random.default_rng(0).permutation(n)
bounds = np.linspace(0, n, parts + 1).astype(np.int64)
for part in range(parts):
    write_entity_names(root, "node", part, (f"entity-{i:07d}" for i in order[bounds[part]:bounds[part + 1]]))
emit(seconds=now())
"""

BASELINE = CHILD_PROLOGUE + r"""
from pbgio.names import close_names
import rapidfuzz.process
emit(seconds=0.0)
"""

SUGGEST = CHILD_PROLOGUE + r"""
from pathlib import Path
from pbgio.names import close_names
start = now()
found = close_names(Path(ARGS["root"]), "node", ARGS["partitions"], ARGS["typo"])
emit(seconds=now() - start, found=found)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", type=int, default=10_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--root", type=Path, default=None)
    args = parser.parse_args()
    root = args.root or REPO_ROOT / "bench-data" / f"names-{args.names}-p{args.partitions}"
    if not (root / f"entity_names_node_{args.partitions - 1}.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        print(f"writing {args.names:,} names to {root} …", flush=True)
        child = run_python(WRITE, {"root": str(root), "names": args.names, "partitions": args.partitions})
        if not child.ok:
            raise SystemExit(child.failure())
    size = sum(p.stat().st_size for p in root.glob("entity_names_node_*.json"))
    base = run_python(BASELINE, {})
    rows = [["imports only", "", "", f"{base.peak_rss_bytes / 2**20:,.0f}"]]
    typos = [f"entity-{args.names // 3:07d}x", f"ENTITY-{args.names // 2:07d}", f"entty-{args.names - 1:07d}"]
    for typo in typos:
        child = run_python(SUGGEST, {"root": str(root), "partitions": args.partitions, "typo": typo})
        if not child.ok:
            raise SystemExit(child.failure())
        rows.append([typo, ", ".join(child.result["found"]), f"{child.result['seconds']:.1f}",
                     f"{child.peak_rss_bytes / 2**20:,.0f}"])
    print(f"{args.names:,} names in {args.partitions} names files, {size / 2**20:,.0f} MiB")
    print(format_table(["typo", "suggested", "seconds", "peak RSS MiB"], rows))


if __name__ == "__main__":
    main()
