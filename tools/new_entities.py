"""New entities, same model: ``pbgio import --append`` + an ``init_path`` warm start on FB15k-237,
against a full retrain.

A seeded share of the entities (``--holdout``, 10% by default) is held out. The initial model is
trained on the train edges among the other ("old") entities only; the filtered MRR of the test
edges among old entities is measured. Then the train, valid and test edges touching held-out
("new") entities are appended to the layout (``append_edge_lists``: old entities keep their rows,
new ones are added, new relations get new ids), and a new checkpoint warm-starts from the initial
one (``init_path``) and trains briefly on all train edges (``--warm-epochs``). Its MRR is measured
on the test edges touching new entities and, again, on the old-entity test edges. The baseline
retrains from scratch on all train edges for the same total number of epochs.

Evaluation is ``pbgtrain eval``'s filtered protocol: every entity is a candidate, candidates that
form a known train, valid or test edge are left out, both sides averaged. The test sets are
restricted to edges whose entities all appear in the train edges the model being measured could
learn from (old ones: the old train edges; new ones: all train edges), so that no entity is
judged on a random row; the left-out test edges still filter.

    python tools/new_entities.py                                   # the settings of the guide's figures
    python tools/new_entities.py --dimension 100 --uniform-negs 100 --epochs 5 --warm-epochs 1 --json out.json
    python tools/new_entities.py --root work/ --keep                # keep the layout and checkpoints

The dataset is ``../shared/datasets/fb15k-237.tar.gz`` (``--archive``); without it the tool says
so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _benchutil import REPO_ROOT, environment, format_table, write_json

ARCHIVE = REPO_ROOT.parent / "shared" / "datasets" / "fb15k-237.tar.gz"
SPLITS = ("train", "valid", "test")
Triple = tuple[str, str, str]


def model_config(args: argparse.Namespace) -> dict[str, Any]:
    """ComplEx as in the reference runs (../shared/datasets/README.md), smaller and shorter."""
    return {
        "entities": {"all": {"num_partitions": 1}},
        "relations": [{"name": "all_edges", "lhs": "all", "rhs": "all", "operator": "complex_diagonal"}],
        "dynamic_relations": True, "global_emb": False, "dimension": args.dimension, "comparator": "dot",
        "loss_fn": "softmax", "lr": 0.1, "regularization_coef": 1e-3, "regularizer": "N3",
        "batch_size": 1000, "num_batch_negs": 50, "num_uniform_negs": args.uniform_negs, "eval_fraction": 0.0,
        "init_scale": 1e-3, "entity_path": "layout", "edge_paths": ["layout/train"], "checkpoint_path": "initial",
    }


def read_split(path: Path) -> list[Triple]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line:
            head, rel, tail = line.split("\t")
            out.append((head, rel, tail))
    return out


def write_split(path: Path, triples: Iterable[Triple]) -> Path:
    path.write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in triples), encoding="utf-8")
    return path


def unpack(archive: Path, into: Path) -> dict[str, list[Triple]]:
    with tarfile.open(archive) as tar:
        tar.extractall(into / "unpacked", filter="data")
    [found] = list((into / "unpacked").rglob("train.tsv"))
    return {split: read_split(found.parent / f"{split}.tsv") for split in SPLITS}


def split_by_entities(data: dict[str, list[Triple]], share: float, seed: int) -> dict[str, Any]:
    """Hold out a seeded ``share`` of the entities; sort every edge into old-only or touching new."""
    entities = sorted({e for triples in data.values() for h, _, t in triples for e in (h, t)})
    held = set(random.Random(seed).sample(entities, round(share * len(entities))))

    def touches(triple: Triple) -> bool:
        return triple[0] in held or triple[2] in held

    parts: dict[str, Any] = {f"{split}_{kind}": [t for t in data[split] if touches(t) == (kind == "new")]
             for split in SPLITS for kind in ("old", "new")}
    seen_old = {e for h, _, t in parts["train_old"] for e in (h, t)}
    seen_all = seen_old | {e for h, _, t in parts["train_new"] for e in (h, t)}
    parts["eval_old"] = [t for t in parts["test_old"] if t[0] in seen_old and t[2] in seen_old]
    parts["eval_new"] = [t for t in parts["test_new"] if t[0] in seen_all and t[2] in seen_all]
    parts["held_out"] = sorted(held)
    parts["entities"] = len(entities)
    return parts


def evaluate(config: Path, overrides: Sequence[str], edge_paths: Sequence[Path],
             filters: Sequence[Path]) -> dict[str, Any]:
    from pbgtrain.config import load_run_config
    from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint

    run = load_run_config(config, list(overrides))
    result = evaluate_checkpoint(run, EvalOptions(edge_paths=list(edge_paths), filter_paths=list(filters)))
    m = result.metrics
    return {"mrr": m.mrr, "hits1": m.hits[1], "hits10": m.hits[10], "mr": m.mr, "count": m.count,
            "seconds": result.seconds, "protocol": m.protocol.describe()}


def train(config: Path, overrides: Sequence[str], seed: int) -> dict[str, Any]:
    from pbgtrain.config import load_run_config
    from pbgtrain.train import FitOptions, fit

    started = time.perf_counter()
    result = fit(load_run_config(config, list(overrides)), FitOptions(seed=seed))
    seconds = time.perf_counter() - started
    edges = sum(r.train.count for r in result.iterations)
    return {"seconds": seconds, "iterations": len(result.iterations), "edges": edges,
            "edges_per_s": edges / seconds if seconds else 0.0, "version": result.final_version}


def evaluate_among_old(root: Path, config: dict[str, Any], checkpoint: str, old_count: int) -> dict[str, Any]:
    """The old test edges ranked among the old entities only (the initial model's candidates): the
    checkpoint's first ``old_count`` rows (append keeps old entities' offsets) in a copy of the layout
    as it was before the append, with the grown relation list (append keeps old relation ids)."""
    from pbgio.checkpoint import CheckpointDir, EmbeddingsState, write_checkpoint
    from pbgio.spec.naming import DYNAMIC_REL_COUNT, DYNAMIC_REL_NAMES

    view = root / f"{checkpoint}_among_old"
    shutil.copytree(root / "layout_before", view / "layout")
    for name in (DYNAMIC_REL_COUNT, DYNAMIC_REL_NAMES):
        shutil.copy(root / "layout" / name, view / "layout" / name)
    source = CheckpointDir(root / checkpoint)
    rows = source.read_embeddings("all", 0).embeddings[:old_count]
    write_checkpoint(CheckpointDir(view / "checkpoint"), 1, embeddings={("all", 0): EmbeddingsState(rows)},
                     model=source.read_model())
    view_config = dict(config, entity_path="layout", edge_paths=["layout/eval_old"], checkpoint_path="checkpoint")
    path = view / "config.json"
    path.write_text(json.dumps(view_config, indent=4), encoding="utf-8")
    return evaluate(path, [], [view / "layout" / "eval_old"], [view / "layout" / s for s in SPLITS])


def run_experiment(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from pbgio.entities import read_entity_count
    from pbgio.importers.append import append_edge_lists
    from pbgio.importers.importer import import_edge_lists
    from pbgio.validate import validate_path

    data = unpack(args.archive, root)
    parts = split_by_entities(data, args.holdout, args.seed)
    tsv = {name: write_split(root / f"{name}.tsv", parts[name]) for name in
           ("train_old", "train_new", "valid_old", "valid_new", "test_old", "test_new", "eval_old", "eval_new")}
    layout = root / "layout"
    config = model_config(args)
    # the initial layout: old entities only; eval_old is a subset of test, kept as its own edge path
    first = dict(config, edge_paths=["layout/train", "layout/valid", "layout/test", "layout/eval_old"])
    config_path = root / "config.json"
    config_path.write_text(json.dumps(first, indent=4), encoding="utf-8")
    started = time.perf_counter()
    import_edge_lists(config_path, [tsv["train_old"], tsv["valid_old"], tsv["test_old"], tsv["eval_old"]],
                      seed=args.seed)
    import_seconds = time.perf_counter() - started
    train_only = ["edge_paths=layout/train"]
    filters = [layout / s for s in SPLITS]
    figures: dict[str, Any] = {"entities": parts["entities"], "held_out": len(parts["held_out"]),
                               "edges": {k: len(v) for k, v in parts.items() if isinstance(v, list)
                                         and k != "held_out"},
                               "import_seconds": import_seconds}
    print(f"{parts['entities']:,} entities, {len(parts['held_out']):,} held out; train edges: "
          f"{len(parts['train_old']):,} among old entities, {len(parts['train_new']):,} touching new ones; "
          f"test edges evaluated: {len(parts['eval_old']):,} old, {len(parts['eval_new']):,} new", flush=True)

    print(f"training the initial model ({args.epochs} epochs, old entities only)", flush=True)
    figures["initial_train"] = train(config_path, [*train_only, f"num_epochs={args.epochs}"], args.seed)
    figures["initial_old"] = evaluate(config_path, [*train_only], [layout / "eval_old"], filters)
    figures["candidates_before"] = read_entity_count(layout, "all", 0)
    print(f"  {figures['initial_train']['seconds']:.0f} s; old-entity test MRR {figures['initial_old']['mrr']:.4f}",
          flush=True)

    shutil.copytree(layout, root / "layout_before")  # to rank the old test edges among the old entities later

    # append: the edges touching new entities go to train/valid/test; eval_new is a new edge path. The
    # config then names a new checkpoint_path, warm-started from the initial one (what a user does)
    grown = dict(config, edge_paths=[*first["edge_paths"], "layout/eval_new"], checkpoint_path="warm",
                 init_path="initial")
    config_path.write_text(json.dumps(grown, indent=4), encoding="utf-8")
    started = time.perf_counter()
    report = append_edge_lists(config_path, [[tsv["train_new"]], [tsv["valid_new"]], [tsv["test_new"]], [],
                                             [tsv["eval_new"]]], seed=args.seed)
    figures["append_seconds"] = time.perf_counter() - started
    figures["candidates_after"] = read_entity_count(layout, "all", 0)
    assert report.append is not None
    figures["append"] = {"new_entities": sum(report.append.new["all"]), "known": report.append.known["all"],
                         "relation_types_before": report.append.relation_types_before,
                         "relation_types": report.relation_types, "edges_added": report.kept}
    print(f"appended in {figures['append_seconds']:.1f} s: {report.entity_line()}", flush=True)
    validation = validate_path(config_path)
    if not validation.ok:
        raise SystemExit(f"the appended layout does not validate: {validation.errors[0]}")

    warm = [*train_only, f"num_epochs={args.warm_epochs}"]
    print(f"warm start: {args.warm_epochs} epoch(s) on all train edges from the initial checkpoint", flush=True)
    figures["warm_train"] = train(config_path, warm, args.seed)
    figures["warm_old"] = evaluate(config_path, warm, [layout / "eval_old"], filters)
    figures["warm_new"] = evaluate(config_path, warm, [layout / "eval_new"], filters)
    figures["warm_old_same_candidates"] = evaluate_among_old(root, config, "warm", figures["candidates_before"])
    print(f"  {figures['warm_train']['seconds']:.0f} s; MRR old {figures['warm_old']['mrr']:.4f}, "
          f"new {figures['warm_new']['mrr']:.4f}", flush=True)

    total = args.epochs + args.warm_epochs
    if not args.no_baseline:
        base = [*train_only, f"num_epochs={total}", "checkpoint_path=baseline", "init_path=null"]
        print(f"baseline: full retrain from scratch, {total} epochs on all train edges", flush=True)
        figures["baseline_train"] = train(config_path, base, args.seed)
        figures["baseline_old"] = evaluate(config_path, base, [layout / "eval_old"], filters)
        figures["baseline_new"] = evaluate(config_path, base, [layout / "eval_new"], filters)
        figures["baseline_old_same_candidates"] = evaluate_among_old(root, config, "baseline",
                                                                     figures["candidates_before"])
        print(f"  {figures['baseline_train']['seconds']:.0f} s; MRR old {figures['baseline_old']['mrr']:.4f}, "
              f"new {figures['baseline_new']['mrr']:.4f}", flush=True)
    return figures


def table(figures: dict[str, Any], args: argparse.Namespace) -> str:
    total = args.epochs + args.warm_epochs
    rows = []

    def row(model: str, key: str, test: str, seconds: str) -> None:
        m = figures.get(key)
        if m is not None:
            rows.append([model, test, f"{m['count']:,}", f"{m['mrr']:.4f}", f"{m['hits10']:.4f}", seconds])

    initial = figures["initial_train"]["seconds"]
    warm = figures["warm_train"]["seconds"] + figures["append_seconds"]
    row(f"initial ({args.epochs} ep, old entities)", "initial_old", "old", f"{initial:.0f}")
    row(f"append + warm start (+{args.warm_epochs} ep)", "warm_old", "old", f"{warm:.0f}")
    row(f"append + warm start (+{args.warm_epochs} ep)", "warm_old_same_candidates", "old, among old", "")
    row(f"append + warm start (+{args.warm_epochs} ep)", "warm_new", "new", "")
    if "baseline_train" in figures:
        base = figures["baseline_train"]["seconds"]
        row(f"full retrain ({total} ep)", "baseline_old", "old", f"{base:.0f}")
        row(f"full retrain ({total} ep)", "baseline_old_same_candidates", "old, among old", "")
        row(f"full retrain ({total} ep)", "baseline_new", "new", "")
    return format_table(["model", "test edges", "edges", "MRR", "Hits@10", "train s"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--archive", type=Path, default=ARCHIVE)
    parser.add_argument("--root", type=Path, default=None, help="work here (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--holdout", type=float, default=0.1, help="share of the entities held out")
    parser.add_argument("--dimension", type=int, default=200)
    parser.add_argument("--uniform-negs", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=10, help="epochs of the initial model")
    parser.add_argument("--warm-epochs", type=int, default=2, help="epochs of the warm start")
    parser.add_argument("--no-baseline", action="store_true", help="skip the full retrain")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if not args.archive.is_file():
        print(f"skipped: {args.archive} is absent (the FB15k-237 archive)")
        return 0
    root = args.root or Path(tempfile.mkdtemp(prefix="pbg-new-entities-"))
    if args.root is not None:
        if root.exists() and any(root.iterdir()):
            parser.error(f"--root {root} is not empty")
        root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        figures = run_experiment(args, root)
        figures["wall_seconds"] = time.perf_counter() - started
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(table(figures, args))
    print(f"(filtered against train+valid+test, every entity a candidate ({figures['candidates_before']:,} before the "
          f"append, {figures['candidates_after']:,} after), both sides averaged; train s: training wall time, the warm "
          f"start's including the append; \"old, among old\": the same edges ranked among the old entities only, "
          f"the initial model's candidates; {figures['wall_seconds'] / 60:.1f} min in all)")
    if args.json:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        write_json(args.json, {"environment": environment(), "settings": settings, **figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
