"""``tools/bench_gpu.py --check``: every GPU line of the fused, captured step with its target, one run.

The lines (each printed with what it measured, its target and whether it is met):

1. **LiveJournal shape** (4.8M entities, 68M edges, one partition, one relation, operator none,
   d100, dot, softmax, 1,000 same-batch + 1,000 uniform negatives per side, row Adagrad, bf16):
   edges/s at batch 10,000 (target ≥ 15M) and 50,000 (≥ 20M).
2. **Freebase86m's shape** (86M entities, 338M edges resident on the card, 14,824 dynamic
   relations, ComplEx d100, one partition, batch 50,000, the same negatives, bf16): the time 10
   epochs take at the measured rate (target ≤ 6 minutes).
3. **FB15k-237, 1-vs-all** (the recipe's model at dimension 2,000, batch 1,000, bf16): seconds
   per epoch (≤ 0.5) and the filtered test MRR reached within the check's training time (the
   target is .37 within 10 minutes of training; the check trains ``--check-fb15k-minutes``).

Lines 1 and 2 run the product's step as the trainer runs it (:func:`pbgtrain.model.runner.make_runner`
with the step ``--step auto`` picks, which on a GPU is the attention form replayed as a CUDA graph;
a bucket's edges resident on the device, batches sliced from a shuffled order there), on random
tables and edges made on the device: no files, so that the check fits in its five minutes. Line 3
is ``pbgtrain fit`` and ``pbgtrain eval`` on the FB15k-237 layout, imported beforehand on a CPU
machine (``--prepare-check DIR``: the card's image may lack polars) and carried.

``--device cpu --scale 0.001`` runs the same code on a CPU at a thousandth of the size (a smoke
run: the figures mean nothing there).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

LIVEJOURNAL = {"entities": 4_847_571, "edges": 68_993_773}
FREEBASE86M = {"entities": 86_054_151, "edges": 338_586_276, "relations": 14_824}
FB15K_BATCH = 1000


@dataclass(frozen=True)
class Line:
    what: str
    measured: str
    target: str
    met: bool | None  # None: nothing to compare (a smoke run on a CPU)

    def cells(self) -> list[str]:
        verdict = "-" if self.met is None else ("met" if self.met else "NOT met")
        return [self.what, self.measured, self.target, verdict]


def step_rate(*, entities: int, edges: int, relations: int, operator: str, batch_size: int, negatives: int,
              device: torch.device, seconds: float, seed: int = 0) -> dict[str, Any]:
    """Edges/s of the run's step on one resident partition: the step ``--step auto`` picks for
    this model on ``device``, batches of ``batch_size`` sliced from a shuffled order of the edges
    on the device, measured over ``seconds`` after the first batches (warm-up and capture)."""
    from pbgtrain.model import BucketEdges, EmbeddingModel, EntityTable, ModelSpec, NegativeSampling, RelationSpec
    from pbgtrain.model.model import make_relation_optimizer
    from pbgtrain.model.precision import precision_scope
    from pbgtrain.model.runner import make_runner
    from pbgtrain.training.fit_plan import resolve_step

    dynamic = relations > 1
    negs = NegativeSampling(negatives, negatives)
    spec = ModelSpec({"entity": 100}, (RelationSpec("rel", "entity", "entity", operator=operator),),
                     num_dynamic_rels=relations if dynamic else None, comparator="dot", loss_fn="softmax",
                     global_emb=False, lr=0.1, relation_lr=0.1, train_negatives=negs, eval_negatives=negs)
    config = SimpleNamespace(loss_fn="softmax", comparator="dot", bias=False, max_norm=None,
                             dynamic_relations=dynamic, relations=[SimpleNamespace(operator=operator, all_negs=False)],
                             num_machines=1, featurized_types=list, batch_size=batch_size, num_batch_negs=negatives,
                             num_uniform_negs=negatives)
    choice = resolve_step("auto", None, False, config, device)
    model = EmbeddingModel(spec).to(device)
    optimizer = make_relation_optimizer(model)
    gen = torch.Generator(device=device).manual_seed(seed)
    table = EntityTable(torch.randn(entities, 100, generator=gen, device=device).mul_(1e-3))
    bucket = BucketEdges(torch.randint(entities, (edges,), generator=gen, device=device),
                         torch.randint(entities, (edges,), generator=gen, device=device),
                         torch.randint(relations, (edges,), generator=gen, device=device), None, None, None)
    order = torch.randperm(edges, generator=gen, device=device)
    runner = make_runner(choice, model, optimizer, device, batch_size)
    runner.reseed(seed)
    rel = None if dynamic else 0
    num_batches = edges // batch_size
    warm = min(8, max(num_batches // 2, 1))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    trained = 0
    started = 0.0
    with precision_scope("bf16", device):
        for k in range(num_batches * 100):  # as many epochs as the time asks for
            if k == warm:
                sync()
                started, trained = time.perf_counter(), 0
            if k > warm and (k - warm) % 16 == 0:
                sync()
                if time.perf_counter() - started >= seconds:
                    break
            i = k % num_batches
            runner.train(bucket, order[i * batch_size:(i + 1) * batch_size], rel, table, table)
            trained += batch_size
        sync()
    elapsed = time.perf_counter() - started
    stats = runner.totals.take()
    if not math.isfinite(stats.loss):
        raise SystemExit(f"the step's loss is not finite ({stats.loss}): {choice.note}")
    return {"edges_per_s": trained / elapsed, "seconds": elapsed, "step": choice.note, "notes": runner.notes,
            "peak_gpu_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None}


def prepare(root: Path) -> Path:
    """Import FB15k-237 with its recipe (a CPU machine, with polars) into ``root``, as the quality
    benchmark does (:func:`bench_quality.prepare`); the config's path."""
    from bench_quality import prepare as prepare_recipe

    return prepare_recipe(root, "fb15k-237") / "config.json"


def fb15k(config: Path, device: torch.device, minutes: float, dimension: int) -> tuple[Line, Line]:
    """The FB15k-237 1-vs-all lines: seconds per epoch, and the test MRR within ``minutes``."""
    from pbgtrain.config import load_run_config
    from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
    from pbgtrain.train import FitOptions, fit

    data = config.parent / "data"
    shutil.rmtree(config.parent / "model", ignore_errors=True)
    overrides = [f"dimension={dimension}", f"batch_size={FB15K_BATCH}", "edge_paths=data/train", "num_epochs=100000"]
    run = load_run_config(config, overrides)
    result = fit(run, FitOptions(device=str(device), precision="bf16", check_layout=False, max_seconds=minutes * 60,
                                 operator_init="identity"))
    seconds = sorted(r.seconds for r in result.iterations)
    per_epoch = seconds[len(seconds) // 2]
    trained_minutes = sum(seconds) / 60
    metrics = evaluate_checkpoint(load_run_config(config, overrides), EvalOptions(
        edge_paths=[data / "test"], filter_paths=[data / s for s in ("train", "valid", "test")],
        device=str(device))).metrics
    cpu = device.type != "cuda"
    return (Line(f"FB15k-237 1-vs-all, d{dimension}, batch {FB15K_BATCH}, bf16: seconds per epoch",
                 f"{per_epoch:.2f} s (median of {len(seconds)} epochs)", "≤ 0.5 s", None if cpu else per_epoch <= 0.5),
            Line("FB15k-237 1-vs-all: filtered test MRR",
                 f"{metrics.mrr:.4f} after {trained_minutes:.1f} min ({len(seconds)} epochs)",
                 "≥ .37 within 10 min", None if cpu else metrics.mrr >= 0.37 and trained_minutes <= 10))


def run(args: argparse.Namespace) -> list[Line]:
    from _benchutil import format_table

    device = torch.device(args.device)
    cpu = device.type != "cuda"
    lines: list[Line] = []
    raw: dict[str, Any] = {}
    lj = {k: max(int(v * args.scale), 1000) for k, v in LIVEJOURNAL.items()}
    for batch, target in ((10_000, 15e6), (50_000, 20e6)):
        batch_size = min(batch, lj["edges"] // 4)
        measured = step_rate(entities=lj["entities"], edges=lj["edges"], relations=1, operator="none",
                             batch_size=batch_size, negatives=min(1000, batch_size), device=device,
                             seconds=args.check_seconds)
        raw[f"livejournal-{batch}"] = measured
        lines.append(Line(f"LiveJournal shape ({lj['entities']:,} entities), batch {batch_size:,}, bf16",
                          f"{measured['edges_per_s'] / 1e6:.2f}M edges/s", f"≥ {target / 1e6:.0f}M",
                          None if cpu else measured["edges_per_s"] >= target))
        print(f"  {lines[-1].what}: {lines[-1].measured} ({measured['step']})", flush=True)
    fb = {k: max(int(v * args.scale), 1000) for k, v in FREEBASE86M.items()}
    batch_size = min(50_000, fb["edges"] // 4)
    measured = step_rate(entities=fb["entities"], edges=fb["edges"], relations=fb["relations"],
                         operator="complex_diagonal", batch_size=batch_size, negatives=min(1000, batch_size),
                         device=device, seconds=args.check_seconds)
    raw["freebase86m"] = measured
    ten_epochs = 10 * fb["edges"] / measured["edges_per_s"]
    lines.append(Line(f"Freebase86m shape ({fb['entities']:,} entities, {fb['edges']:,} edges), ComplEx d100, "
                      f"batch {batch_size:,}: 10 epochs", f"{ten_epochs / 60:.1f} min "
                      f"({measured['edges_per_s'] / 1e6:.2f}M edges/s)", "≤ 6 min",
                      None if cpu else ten_epochs <= 360))
    print(f"  {lines[-1].what}: {lines[-1].measured} ({measured['step']})", flush=True)
    if args.prepared is None:
        lines.append(Line("FB15k-237 1-vs-all", "skipped: no --prepared DIR (tools/bench_gpu.py --prepare-check "
                          "DIR on a CPU machine imports it)", "≤ 0.5 s an epoch; ≥ .37 in 10 min", False))
    else:
        lines += fb15k(args.prepared / "fb15k-237" / "config.json", device, args.check_fb15k_minutes,
                       args.check_fb15k_dimension)
    print(format_table(["line", "measured", "target", ""], [line.cells() for line in lines]))
    if args.json:
        args.json.write_text(json.dumps({"lines": [line.__dict__ for line in lines], "runs": raw}, indent=2) + "\n")
    return lines
