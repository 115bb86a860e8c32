"""Nearest-neighbour indexes against the exact scan: build time, index size, peak RSS, recall@10,
queries/s and latency per query (exact and indexed), on the product's own code paths.

``synthetic``: a table with planted clusters (``--rows`` rows of d ``--dim`` in ``--partitions``
partitions, one centre per 500 rows, each row its centre plus N(0, 0.7²) noise; seeded) written
as a checkpoint under ``--root``. Then, each phase in a child process (its peak RSS is the
phase's):

1. build: ``pbgio.index.build_index`` (the ``pbgio index build`` path), timed;
2. exact: the exact scan ``pbgio neighbors`` runs (every partition read from disk, scored by
   :class:`pbgio.topk.VectorScorer` a block at a time) for ``--queries`` random rows at once (the
   ground truth), and for a few single queries (its latency per query);
3. indexed: ``open_index`` once, then each query alone through ``EmbeddingIndex.top_k`` (index
   proposes ``--candidates`` rows, read from the checkpoint and scored exactly), and all of them
   in one batch (queries/s); recall@10 against the exact top 10 (the query row left out of both).

``fb15k-237``: a trained FB15k-237 checkpoint (``--config``): the neighbours' recall as above with
an IVF index forced (the type is small enough for ``auto`` to pick an exact flat index), and
``pbgtrain predict --index`` (:class:`pbgtrain.predict.Predictor`) against the exact scan for
``--queries`` random (entity, relation, side) queries: the share whose top 10 is identical, and
whether every score returned equals the model's exact score for that candidate.

``libraries``: how the index was chosen. The same kind of clustered table (``--rows``, in
memory), cos, one thread per query: FAISS IVF with 8-bit codes (``nlist`` 4·√rows, nprobe 8–64)
and FAISS HNSW, hnswlib and USearch (graphs, ef 64–128), each re-ranked exactly from the top 100
as pbg does; build seconds, bytes, ms per query, recall@10. The libraries are installed into a
side venv under ``--root`` (``--peers-venv``), never into pbg's dependencies.

    .venv/bin/python tools/bench_ann.py synthetic --rows 1000000
    .venv/bin/python tools/bench_ann.py libraries --rows 1000000
    .venv/bin/python tools/bench_ann.py synthetic --rows 10000000 --partitions 4
    .venv/bin/python tools/bench_ann.py fb15k-237 --config bench-data/quality/fb15k-237/ann-config.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _benchutil import CHILD_PROLOGUE, REPO_ROOT, environment, format_table, run_python

ROWS_PER_CENTRE = 500
NOISE = 0.7


# --------------------------------------------------------------------------- the synthetic table

WRITE = CHILD_PROLOGUE + r"""
import numpy as np
from pathlib import Path
from pbgio.checkpoint import CheckpointDir, EmbeddingsState, ModelState, commit_steps
from pbgio.config import parse_config
root = Path(ARGS["root"]); rows, dim, parts = ARGS["rows"], ARGS["dim"], ARGS["partitions"]
cfg = parse_config({"entities": {"item": {"num_partitions": parts}},
                    "relations": [{"name": "r", "lhs": "item", "rhs": "item"}], "dimension": dim,
                    "global_emb": False, "comparator": "cos", "entity_path": "data", "edge_paths": ["data/edges"],
                    "checkpoint_path": "model"})
(root / "data").mkdir(parents=True, exist_ok=True)
(root / "config.json").write_text(cfg.to_json())
ckpt = CheckpointDir(root / "model")
rng = np.random.default_rng(0)
centres = rng.standard_normal((max(rows // ARGS["per_centre"], 1), dim), dtype=np.float32)
bounds = np.linspace(0, rows, parts + 1).astype(np.int64)
start = now()
for part in range(parts):
    count = int(bounds[part + 1] - bounds[part])
    table = np.empty((count, dim), np.float32)
    for s in range(0, count, 1 << 20):
        e = min(count, s + (1 << 20))
        table[s:e] = centres[rng.integers(0, len(centres), e - s)]
        table[s:e] += ARGS["noise"] * rng.standard_normal((e - s, dim), dtype=np.float32)
    ckpt.write_embeddings("item", part, 1, EmbeddingsState(table, None))
    (root / "data" / f"entity_count_item_{part}.txt").write_text(f"{count}\n")
    del table
for step in commit_steps(ckpt, 1, embeddings={}, model=ModelState({}, None), config=cfg):
    step.run()
emit(seconds=now() - start)
"""

BUILD = CHILD_PROLOGUE + r"""
from pbgio.index import build_index
start = now()
built = build_index(ARGS["config"], ARGS["type"], kind=ARGS["kind"], metric=ARGS["metric"], nlist=ARGS.get("nlist"),
                    nprobe=ARGS.get("nprobe"))
emit(seconds=now() - start, bytes=built.bytes, kind=built.meta.kind, params=built.meta.params,
     rows=built.meta.rows)
"""

READ_META = CHILD_PROLOGUE + r"""
from pathlib import Path
from pbgio.index import read_index_meta
emit(meta=read_index_meta(Path(ARGS["path"])).to_json())
"""

QUERIES = r"""
import numpy as np
from pbgio.config import load_config
from pbgio.index_file import TypeRows
from pbgio.layout import open_checkpoint
source = open_checkpoint(ARGS["config"])
rows = TypeRows(source.config, source.checkpoint, source.version, ARGS["type"], add_global=True)
counts = rows.partition_rows()
rng = np.random.default_rng(1)
ids = np.sort(rng.choice(sum(counts), ARGS["queries"], replace=False))
starts = np.concatenate([[0], np.cumsum(counts)])
parts = np.searchsorted(starts, ids, side="right") - 1
offsets = ids - starts[parts]
queries = np.concatenate([rows.rows(int(p), offsets[parts == p]) for p in np.unique(parts)])
selves = list(zip(parts.tolist(), offsets.tolist()))
"""

EXACT = CHILD_PROLOGUE + QUERIES + r"""
from pbgio.topk import VectorScorer, rows_per_block, scan_partitions
def exact(vectors, k):
    scorer = VectorScorer(vectors, ARGS["metric"], "cpu")
    def open_partition(part):
        table = rows.partition(part)
        return len(table), lambda s, e: scorer(table[s:e])
    step = rows_per_block(max(rows.dimension, len(vectors)), 1 << 24, 1 << 16)
    return scan_partitions(range(len(counts)), open_partition, k=k, block_rows=step, queries=len(vectors)).tops
start = now()
tops = exact(queries, 11)
batch = now() - start
truth = [[(p, o) for _, p, o in top.items() if (p, o) != self][:10] for top, self in zip(tops, selves)]
single = []
for i in range(ARGS["single"]):
    start = now()
    exact(queries[i:i + 1], 11)
    single.append(now() - start)
emit(batch_seconds=batch, single_seconds=single, truth=truth)
"""

INDEXED = CHILD_PROLOGUE + QUERIES + r"""
from pbgio.index import open_index
start = now()
index = open_index(ARGS["config"], ARGS["type"], nprobe=ARGS.get("nprobe"))
load = now() - start
rss_loaded = peak_rss_bytes()
single, found = [], []
for i in range(len(queries)):
    start = now()
    [best] = index.top_k(queries[i:i + 1], 10, candidates=ARGS["candidates"], exclude=[selves[i]])
    single.append(now() - start)
    found.append([(p, o) for _, p, o in best])
start = now()
batch = index.top_k(queries, 10, candidates=ARGS["candidates"], exclude=selves)
batch_seconds = now() - start
same = all([(p, o) for _, p, o in b] == f for b, f in zip(batch, found))
emit(load_seconds=load, single_seconds=single, batch_seconds=batch_seconds, found=found, same_in_batch=same,
     rss_loaded=rss_loaded, describe=index.describe())
"""


def _run(code: str, args: dict) -> dict:
    child = run_python(code, args, cwd=REPO_ROOT)
    if not child.ok:
        sys.exit(child.failure())
    return {**child.result, "peak_rss": child.peak_rss_bytes}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _recall(found: list[list], truth: list[list]) -> float:
    hits = sum(len({tuple(x) for x in f} & {tuple(x) for x in t}) for f, t in zip(found, truth, strict=True))
    return hits / sum(len(t) for t in truth)


def _neighbour_figures(config: Path, entity_type: str, args: argparse.Namespace, build: dict,
                       table_bytes: int) -> dict:
    common = {"config": str(config), "type": entity_type, "metric": args.metric, "queries": args.queries}
    exact = _run(EXACT, {**common, "single": args.single})
    indexed = _run(INDEXED, {**common, "candidates": args.candidates, "nprobe": args.nprobe})
    exact_latency = _median(exact["single_seconds"])
    index_latency = _median(indexed["single_seconds"])
    return {
        "build_seconds": round(build["seconds"], 1), "kind": build["kind"], "params": build["params"],
        "index_bytes": build["bytes"], "table_bytes": table_bytes, "build_peak_rss": build["peak_rss"],
        "query_peak_rss": indexed["peak_rss"], "load_seconds": round(indexed["load_seconds"], 2),
        "recall_at_10": round(_recall(indexed["found"], exact["truth"]), 4),
        "exact_ms_per_query": round(exact_latency * 1e3, 1),
        "exact_batch_queries_per_s": round(args.queries / exact["batch_seconds"], 2),
        "index_ms_per_query": round(index_latency * 1e3, 3),
        "index_batch_queries_per_s": round(args.queries / indexed["batch_seconds"], 1),
        "speedup_single_query": round(exact_latency / index_latency, 1),
        "batch_equals_single": indexed["same_in_batch"], "searched": indexed["describe"],
    }


def _print(figures: dict) -> None:
    gib = 2 ** 30
    rows = [
        ["index", f"{figures['kind']} {figures['params']}"],
        ["build", f"{figures['build_seconds']} s, peak RSS {figures['build_peak_rss'] / gib:.2f} GiB"],
        ["table / index on disk", f"{figures['table_bytes'] / gib:.2f} GiB / {figures['index_bytes'] / gib:.3f} GiB"],
        ["query process peak RSS", f"{figures['query_peak_rss'] / gib:.2f} GiB (load {figures['load_seconds']} s)"],
        ["recall@10 vs exact", str(figures["recall_at_10"])],
        ["exact scan, one query", f"{figures['exact_ms_per_query']} ms"],
        ["exact scan, batch", f"{figures['exact_batch_queries_per_s']} queries/s"],
        ["indexed, one query", f"{figures['index_ms_per_query']} ms ({figures['speedup_single_query']}× faster)"],
        ["indexed, batch", f"{figures['index_batch_queries_per_s']} queries/s"],
    ]
    print(format_table(["figure", "value"], rows))


def synthetic(args: argparse.Namespace) -> dict:
    root = Path(args.root) / f"synthetic-{args.rows}-d{args.dim}-p{args.partitions}"
    config = root / "config.json"
    if not (root / "model" / "checkpoint_version.txt").is_file():
        print(f"writing {args.rows:,} rows of d{args.dim} in {args.partitions} partition(s) to {root} …", flush=True)
        _run(WRITE, {"root": str(root), "rows": args.rows, "dim": args.dim, "partitions": args.partitions,
                     "per_centre": ROWS_PER_CENTRE, "noise": NOISE})
    table_bytes = sum(p.stat().st_size for p in (root / "model").glob("embeddings_*.h5"))
    index_file = root / "model" / "index_item.v1.h5"
    if args.reuse_index and index_file.is_file():
        print(f"reusing {index_file} (no build figures) …", flush=True)
        meta = json.loads(_run(READ_META, {"path": str(index_file)})["meta"])
        build = {"seconds": float("nan"), "bytes": index_file.stat().st_size, "kind": meta["kind"],
                 "params": meta["params"], "peak_rss": 0}
    else:
        print("building the index …", flush=True)
        build = _run(BUILD, {"config": str(config), "type": "item", "kind": args.kind, "metric": args.metric,
                             "nlist": args.nlist, "nprobe": args.nprobe})
    print("exact and indexed queries …", flush=True)
    return _neighbour_figures(config, "item", args, build, table_bytes)


PREDICT = CHILD_PROLOGUE + r"""
import json
import numpy as np
from pbgtrain.config import load_run_config
from pbgtrain.predict import Predictor, score_triples
from pbgio.names import names_at
run = load_run_config(ARGS["config"])
names = names_at(run.entity_path, "all", 0, range(ARGS["entities"]))
rels = json.load(open(run.entity_path / "dynamic_rel_names.json")) if run.config.dynamic_relations else [
    r.name for r in run.config.relations]
rng = np.random.default_rng(2)
asked = [(names[int(rng.integers(len(names)))], rels[int(rng.integers(len(rels)))], bool(rng.integers(2)))
         for _ in range(ARGS["queries"])]
def answers(predictor):
    out, times = [], []
    for name, rel, rank_rhs in asked:
        start = now()
        r = predictor.top_k(rel=rel, lhs=name, k=10) if rank_rhs else predictor.top_k(rel=rel, rhs=name, k=10)
        times.append(now() - start)
        out.append(r)
    return out, times
with Predictor(run) as p:
    exact, exact_times = answers(p)
with Predictor(run, index=True, nprobe=ARGS.get("nprobe")) as p:
    indexed, index_times = answers(p)
same = sum([x.name for x in a.predictions] == [x.name for x in b.predictions] for a, b in zip(exact, indexed))
recall = sum(len({x.name for x in a.predictions} & {x.name for x in b.predictions}) for a, b in zip(exact, indexed)) \
    / sum(len(a.predictions) for a in exact)
exact_scores = {}
for r in exact:
    for x in r.predictions:
        exact_scores[(r.side, str(sorted(r.query.items())), x.name)] = x.score
checked = mismatched = 0
worst_vs_scan = 0.0
for r in indexed:
    for x in r.predictions:
        key = (r.side, str(sorted(r.query.items())), x.name)
        if key in exact_scores:
            checked += 1
            mismatched += exact_scores[key] != x.score
            worst_vs_scan = max(worst_vs_scan, abs(exact_scores[key] - x.score))
# every score returned, against the model's score of that triple computed on its own (score_triples)
triples = [(r.query.get("lhs", x.name), r.query["rel"], r.query.get("rhs", x.name))
           for r in indexed for x in r.predictions]
scored = score_triples(run, triples).scores
returned = [(r.side, x.score) for r in indexed for x in r.predictions]
worst_vs_triple = max(abs((t.score if side == "rhs" else t.lhs_side_score) - score)
                      for t, (side, score) in zip(scored, returned))
emit(same_top10=same, recall=recall, queries=len(asked), searched=indexed[0].searched, checked=checked,
     mismatched=mismatched,
     worst_vs_scan=worst_vs_scan, worst_vs_triple=worst_vs_triple,
     exact_ms=1e3 * sorted(exact_times)[len(exact_times) // 2],
     index_ms=1e3 * sorted(index_times)[len(index_times) // 2])
"""


def fb15k(args: argparse.Namespace) -> dict:
    config = Path(args.config).resolve()
    data = json.loads(config.read_text())
    entities = int((config.parent / data["entity_path"] / "entity_count_all_0.txt").read_text())
    figures: dict = {}
    for kind, probes in (("auto", [None]), ("ivf", [int(p) for p in args.predict_nprobes.split(",")])):
        build = _run(BUILD, {"config": str(config), "type": "all", "kind": kind, "metric": args.metric,
                             "nlist": args.nlist, "nprobe": args.nprobe})
        table_bytes = sum(p.stat().st_size for p in (config.parent / data["checkpoint_path"]).glob("embeddings_*.h5"))
        figures[f"neighbors_{kind}"] = _neighbour_figures(config, "all", args, build, table_bytes)
        print(f"neighbours, index kind {kind}:")
        _print(figures[f"neighbors_{kind}"])
        for nprobe in probes:
            predict = _run(PREDICT, {"config": str(config), "entities": entities, "queries": args.predict_queries,
                                     "nprobe": nprobe})
            figures[f"predict_{kind}_{nprobe}"] = predict
            print(f"predict --index ({predict['searched']}): identical top 10 for {predict['same_top10']} of "
                  f"{predict['queries']} queries, recall@10 {predict['recall']:.4f}; {predict['checked']} scores "
                  f"compared with the exact scan's, {predict['mismatched']} differ (largest difference "
                  f"{predict['worst_vs_scan']:.3g}; against each triple scored alone "
                  f"{predict['worst_vs_triple']:.3g}); "
                  f"median {predict['exact_ms']:.1f} ms exact, {predict['index_ms']:.1f} ms indexed per query",
                  flush=True)
        print()
    return figures


LIBRARIES = r"""
import json, sys, time
import numpy as np
args = json.loads(sys.argv[1])
n, d, nq = args["rows"], args["dim"], args["queries"]
rng = np.random.default_rng(0)
centres = rng.standard_normal((max(n // args["per_centre"], 1), d), dtype=np.float32)
X = centres[rng.integers(0, len(centres), n)] + args["noise"] * rng.standard_normal((n, d), dtype=np.float32)
X /= np.linalg.norm(X, axis=1, keepdims=True)
Q = X[rng.choice(n, nq, replace=False)]
start = time.perf_counter()
exact = np.argsort(-(Q @ X.T), axis=1)[:, :10]
exact_ms = 1e3 * (time.perf_counter() - start) / nq
rows = []
def measure(name, build, search, settings):
    start = time.perf_counter()
    index, size = build()
    seconds = time.perf_counter() - start
    for setting in settings:
        start = time.perf_counter()
        found = [search(index, setting, q) for q in Q]
        ms = 1e3 * (time.perf_counter() - start) / nq
        reranked = [ids[ids >= 0][np.argsort(-(X[ids[ids >= 0]] @ q))][:10] for ids, q in zip(found, Q)]
        recall = np.mean([len(set(r.tolist()) & set(t.tolist())) / 10 for r, t in zip(reranked, exact)])
        rows.append([name, f"{setting}", round(seconds, 1), size, round(ms, 3), round(float(recall), 4)])
        print(json.dumps(rows[-1]), flush=True)
import faiss
faiss.omp_set_num_threads(1)
nlist = round(4 * np.sqrt(n))
def ivf():
    index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(d), d, nlist, faiss.ScalarQuantizer.QT_8bit,
                                          faiss.METRIC_INNER_PRODUCT)
    faiss.omp_set_num_threads(2)
    index.train(X[rng.choice(n, min(n, 64 * nlist), replace=False)])
    index.add(X)
    faiss.omp_set_num_threads(1)
    return index, faiss.serialize_index(index).nbytes
def ivf_search(index, nprobe, q):
    index.nprobe = nprobe
    return index.search(q[None], 100)[1][0]
measure(f"faiss {faiss.__version__} IVF{nlist},SQ8", ivf, ivf_search, [8, 16, 64])
def hnsw():
    faiss.omp_set_num_threads(2)
    index = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 64
    index.add(X)
    faiss.omp_set_num_threads(1)
    return index, faiss.serialize_index(index).nbytes
def hnsw_search(index, ef, q):
    index.hnsw.efSearch = ef
    return index.search(q[None], 100)[1][0]
measure("faiss HNSW32", hnsw, hnsw_search, [100, 128])
import hnswlib
def hnswlib_build():
    index = hnswlib.Index("ip", d)
    index.init_index(n, M=16, ef_construction=64)
    index.add_items(X, num_threads=2)
    import os, tempfile
    with tempfile.TemporaryDirectory() as tmp:
        index.save_index(os.path.join(tmp, "index.bin"))
        return index, os.path.getsize(os.path.join(tmp, "index.bin"))
def hnswlib_search(index, ef, q):
    index.set_ef(ef)
    return index.knn_query(q[None], 100, num_threads=1)[0][0].astype(np.int64)
measure(f"hnswlib {hnswlib.__version__ if hasattr(hnswlib, '__version__') else ''} M16", hnswlib_build,
        hnswlib_search, [100, 128])
import usearch
from usearch.index import Index
def usearch_build():
    index = Index(ndim=d, metric="ip", dtype="i8", connectivity=16, expansion_add=64)
    index.add(np.arange(n), X, threads=2)
    return index, index.memory_usage
def usearch_search(index, ef, q):
    index.expansion_search = ef
    return np.asarray(index.search(q, 100, threads=1).keys, dtype=np.int64)
measure(f"usearch {usearch.__version__} i8 M16", usearch_build, usearch_search, [100, 128])
print("EXACT_MS", exact_ms)
"""


def libraries(args: argparse.Namespace) -> None:
    import subprocess
    import venv

    env_dir = Path(args.peers_venv or Path(args.root) / "peers-venv")
    python = env_dir / "bin" / "python"
    if not python.exists():
        print(f"creating {env_dir} with faiss-cpu, hnswlib, usearch …", flush=True)
        venv.create(env_dir, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "numpy", "faiss-cpu", "hnswlib", "usearch"],
                       check=True)
    settings = {"rows": args.rows, "dim": args.dim, "queries": args.queries, "per_centre": ROWS_PER_CENTRE,
                "noise": NOISE}
    out = subprocess.run([str(python), "-c", LIBRARIES, json.dumps(settings)], check=True, capture_output=True,
                         text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    exact_ms = next(float(line.split()[1]) for line in out.splitlines() if line.startswith("EXACT_MS"))
    print(format_table(["library and index", "ef / nprobe", "build s", "bytes", "ms/query", "recall@10"],
                       [[str(c) for c in row] for row in rows]))
    print(f"exact (numpy, in memory, batch of {args.queries}): {exact_ms:.1f} ms/query")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["synthetic", "fb15k-237", "libraries"])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--root", default=str(REPO_ROOT / "bench-data" / "ann"))
    parser.add_argument("--config", default=str(REPO_ROOT / "bench-data" / "quality" / "fb15k-237" / "ann-config.json"))
    parser.add_argument("--kind", default="auto", choices=["auto", "flat", "ivf", "hnsw"])
    parser.add_argument("--metric", default="cos", choices=["cos", "dot"])
    parser.add_argument("--nlist", type=int, default=None)
    parser.add_argument("--nprobe", type=int, default=None)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--single", type=int, default=3, help="single exact-scan queries timed")
    parser.add_argument("--predict-queries", type=int, default=1000)
    parser.add_argument("--predict-nprobes", default="16,64,256", help="fb15k-237: nprobe values of the forced IVF")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--reuse-index", action="store_true",
                        help="synthetic: search the index a previous run built (no build figures)")
    parser.add_argument("--peers-venv", default=None, help="libraries: the side venv (default ROOT/peers-venv)")
    args = parser.parse_args()
    import torch

    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {environment()['cpus']} cpus", flush=True)
    if args.what == "libraries":
        libraries(args)
        return
    if args.what == "synthetic":
        figures = synthetic(args)
        _print(figures)
    else:
        args.metric = "dot" if args.metric == "cos" and "dot" in Path(args.config).read_text() else args.metric
        figures = fb15k(args)
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": environment(), "figures": figures}, indent=2) + "\n")


if __name__ == "__main__":
    main()
