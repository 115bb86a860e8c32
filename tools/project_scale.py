"""Project what a graph needs on one machine from a measured ``bench_gpu.py --scenario freebase`` run.

Reads the ``--json`` of a partitioned freebase run (docs/guides/scaling.md) and prints, for
Freebase86m, full Freebase and Twitter: the partitions the memory rule (pbgio.training_memory)
needs on machines of 24, 64 and 256 GiB, the memory of each stage, the disk, and hours per epoch
on N cores and on one GPU. Every figure is a measured rate times the graph's size:

- training: ``num_edge_chunks`` such that a chunk of one bucket holds at most 50M edges; the run's
  edges/s of training on its cores, times N/cores (an assumption: the step
  parallelises over cores; not measured past the run's cores), plus the swap time per bucket
  measured (fit's wall time less its training time, over its buckets), scaled by partition size;
- import: edges/s and peak bytes per distinct name of the run's import;
- export, index: rows/s of the run's stages (index build scaled by √rows more: its lists grow as √rows);
- one GPU: ``--gpu-edges-per-s`` (default 2.05M: the H200 figure of docs/guides/gpu.md, LiveJournal's
  shape at d100), unmeasured for these graphs.

    .venv/bin/python tools/project_scale.py bench-data/fb4-after.json --cores 2
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pbgio.training_memory import GIB, MemoryRule, partitions_needed

GRAPHS = {  # entities, edges (Freebase86m: Marius; full Freebase and Twitter: the PBG paper)
    "Freebase86m": (86_054_151, 338_586_276),
    "Freebase (full)": (121_000_000, 2_400_000_000),
    "Twitter": (41_652_230, 1_468_365_182),
}
DIMENSION = 100
ROW_BYTES = 4 * DIMENSION
TSV_BYTES_PER_EDGE = 24.2  # the scenario's edge list (n…<TAB>r…<TAB>n…): 2,047,368,947 B for 84,646,569 edges
CHUNK_EDGES = 50_000_000  # num_edge_chunks is set so that a chunk of a bucket holds at most this many edges
EDGE_FILE_BYTES = 24.4  # imported buckets (lhs, rel, rhs as int64): 2,064,134,144 B for the same edges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, help="bench_gpu.py --json of a partitioned freebase run")
    parser.add_argument("--cores", type=int, default=2, help="cores of the machine that ran it")
    parser.add_argument("--project-cores", type=int, nargs="+", default=[2, 16, 64])
    parser.add_argument("--gpu-edges-per-s", type=float, default=2.05e6)
    parser.add_argument("--import-json", type=Path, default=None,
                        help="a later --json whose import stage replaces the run's (the same shape)")
    parser.add_argument("--training-json", type=Path, default=None,
                        help="a --json whose edges/s of training replaces the run's (the same model and step, "
                             "e.g. a run at another scale on a machine nothing else shared)")
    args = parser.parse_args()
    run = json.loads(args.result.read_text())["results"]["freebase"]
    stages = {s["stage"]: s for s in run["stages"]}
    if args.import_json:
        stages["import"] = next(s for s in json.loads(args.import_json.read_text())["results"]["freebase"]["stages"]
                                if s["stage"] == "import")
    entities, edges, parts = run["shape"]["entities"], run["shape"]["edges"], run["partitions"]
    train_seconds = run["train_edges"] / run["train_edges_per_s"]
    train_rate = (json.loads(args.training_json.read_text())["results"]["freebase"]["train_edges_per_s"]
                  if args.training_json else run["train_edges_per_s"])
    swap_per_bucket = max(0.0, stages["fit"]["seconds"] - train_seconds) / parts**2
    partition_bytes = entities / parts * ROW_BYTES
    swap_rate = partition_bytes / max(swap_per_bucket, 1e-9)  # bytes of a partition swapped per second
    import_rate = edges / stages["import"]["seconds"]
    import_bytes_per_name = stages["import"]["peak_rss_bytes"] / entities
    rates = {fmt: entities / stages[f"export {fmt}"]["seconds"] for fmt in ("npy", "parquet", "tsv")}
    tsv_bytes_per_row = stages["export tsv"]["output_bytes"] / entities
    index_rate = entities / stages["index build"]["seconds"]
    index_bytes_per_row = stages["index build"]["output_bytes"] / entities
    print(f"measured ({args.result.name}, {args.cores} cores): {entities:,} entities, {edges:,} edges, {parts} "
          f"partitions; training {train_rate:,.0f} edges/s, swap {swap_per_bucket:.2f} s a bucket "
          f"({swap_rate / 1e9:.2f} GB/s of partition), import {import_rate:,.0f} edges/s and "
          f"{import_bytes_per_name:.0f} B a name at peak, export npy/parquet/tsv {rates['npy']:,.0f}/"
          f"{rates['parquet']:,.0f}/{rates['tsv']:,.0f} rows/s, index {index_rate:,.0f} rows/s")
    for name, (rows, count) in GRAPHS.items():
        print(f"\n{name}: {rows:,} entities, {count:,} edges, d{DIMENSION}: table {rows * ROW_BYTES / 1e9:.1f} GB")
        chunks = max(1, math.ceil(count / CHUNK_EDGES))
        for memory in (24, 64, 256):
            p = partitions_needed(rows=rows, dimension=DIMENSION, edges=count, memory_gib=memory, edge_chunks=chunks)
            rule = MemoryRule(math.ceil(rows / p), DIMENSION, math.ceil(count / p**2), chunks, min(2, p))
            swaps = (p**2 if p > 1 else 0) * (rows / p * ROW_BYTES) / swap_rate
            hours = {n: (count / (train_rate * n / args.cores) + swaps) / 3600 for n in args.project_cores}
            print(f"  {memory:>3} GiB: {p} partition(s), fit holds {rule.total_bytes / GIB:.1f} GiB; hours an epoch: "
                  + ", ".join(f"{h:.1f} on {n} cores" for n, h in hours.items())
                  + f"; swapping {swaps / 3600:.2f} h of it")
        index_seconds = rows / index_rate * math.sqrt(rows / entities)
        card = rows * (ROW_BYTES + 12) / 1e9
        print(f"  import: {count / import_rate / 3600:.1f} h, {rows * import_bytes_per_name / GIB:.1f} GiB "
              f"(its name dictionary); one GPU, one partition if the card holds {card:.0f} GB: "
              f"{count / args.gpu_edges_per_s / 60:.1f} min an epoch (unmeasured)")
        print(f"  export: npy {rows / rates['npy'] / 60:.0f} min, parquet {rows / rates['parquet'] / 60:.0f} min, "
              f"tsv {rows / rates['tsv'] / 60:.0f} min ({rows * tsv_bytes_per_row / 1e9:.0f} GB); index build "
              f"{index_seconds / 3600:.1f} h ({rows * index_bytes_per_row / 1e9:.1f} GB); disk: edges "
              f"{count * TSV_BYTES_PER_EDGE / 1e9:.0f} GB of TSV in, {count * EDGE_FILE_BYTES / 1e9:.0f} GB imported, "
              f"checkpoint {rows * (ROW_BYTES + 4) / 1e9:.0f} GB")


if __name__ == "__main__":
    main()
