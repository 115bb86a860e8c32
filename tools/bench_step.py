"""Throughput of ``pbgtrain.model.train_step`` on the FB15k-237 benchmark shape, random data.

    python tools/bench_step.py                   # ~10 s measured after warm-up, default shape
    python tools/bench_step.py --seconds 30 --per-chunk-uniform --json out.json
    python tools/bench_step.py --profile         # torch profiler table of a few steps
    python tools/bench_step.py --overhead        # host time per step where the arithmetic is tiny
    python tools/bench_step.py --overhead --ops  # + the operations a step dispatches
    python tools/bench_step.py --livejournal --step attention --ops   # the softmax as attention, LiveJournal's shape

``--overhead`` is the LiveJournal model (one relation, operator none, dot, softmax, no N3) at
dimension 8, batch 100, 100 batch + 100 uniform negatives: the arithmetic of a step is a few
microseconds, so its time is what the host spends dispatching (the time a GPU would wait for).
``--livejournal`` is the partitioned benchmark's shape (a 1.25M-row partition, dimension 100,
operator none, dot, softmax, no N3, batch 10,000, 1,000 same-batch + 1,000 uniform negatives).
``--step`` picks the head (``scores``: the score matrices, ``attention``: the softmax over
negatives as attention, with ``--core`` explicit or fused kernels; :mod:`pbgtrain.model.step_choice`).
``--ops`` (``--count-ops``, its older name) counts with the profiler the operations one step of
the trainer (``add_train_step``, its sums left on the device) dispatches, every ``aten::`` one and
those that compute (:mod:`pbgtrain.model.op_count`'s rule: the ones that would each be a kernel
launch on a GPU), and those of the body a replayed step runs on the same shape
(:func:`~pbgtrain.model.op_count.count_replayed_step`: the batch padded, the rates and the
negatives' generator on the device), by module; printed next to the edges/s.

Default shape (the issue's benchmark configuration): one entity type of 14,541 entities in one
partition, 237 dynamic relations, ComplEx (complex_diagonal), dimension 400, dot comparator,
softmax loss, N3 1e-3, batch 1000, 50 batch negatives + 1000 uniform negatives, lr 0.1.
Edges are uniform random ids, so the figure measures the model core only (no I/O, no batching).
``--per-chunk-uniform`` samples uniform negatives per chunk as the original does instead of
once per batch. Figures are printed, never asserted; the machine may be shared, so compare
runs taken back to back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pbgtrain.model import (
    EdgeBatch,
    EmbeddingModel,
    EntityTable,
    ModelSpec,
    NegativeSampling,
    RelationSpec,
    StepStats,
    StepTotals,
    add_train_step,
    keep_freed_memory,
    make_relation_optimizer,
    train_step,
)
from pbgtrain.model.attention import AttentionHead, ExplicitAttention, FusedAttention
from pbgtrain.model.op_count import count_ops, count_replayed_step
from pbgtrain.model.precision import precision_scope
from pbgtrain.model.runner import make_head
from pbgtrain.model.step_choice import StepChoice


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entities", type=int, default=14541)
    p.add_argument("--relations", type=int, default=237)
    p.add_argument("--dimension", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--batch-negs", type=int, default=50)
    p.add_argument("--uniform-negs", type=int, default=1000)
    p.add_argument("--operator", default="complex_diagonal")
    p.add_argument("--comparator", default="dot")
    p.add_argument("--loss", default="softmax")
    p.add_argument("--reg", type=float, default=1e-3)
    p.add_argument("--all-negs", action="store_true", help="score every entity (1-vs-all) instead of sampling")
    p.add_argument("--per-chunk-uniform", action="store_true", help="uniform negatives per chunk (original)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps")
    p.add_argument("--seconds", type=float, default=10.0, help="measured time")
    p.add_argument("--device", default="cpu")
    p.add_argument("--default-malloc", action="store_true", help="skip keep_freed_memory() (glibc defaults)")
    p.add_argument("--profile", action="store_true", help="print a torch profiler table of 5 steps")
    p.add_argument("--compile", action="store_true", help="fuse the elementwise passes (torch.compile)")
    p.add_argument("--step", choices=["scores", "attention"], default="scores", help="the step's head")
    p.add_argument("--core", choices=["explicit", "fused"], default=None,
                   help="the attention head's core (default: the device's, attention_core)")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--livejournal", action="store_true", help="the partitioned benchmark's shape (see above)")
    p.add_argument("--overhead", action="store_true", help="the LiveJournal model at d8, batch 100, 100+100 negatives")
    p.add_argument("--ops", "--count-ops", dest="ops", action="store_true",
                   help="count the operations one step dispatches, and a replayed step's body")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    if args.overhead:
        args.dimension, args.batch_size, args.batch_negs, args.uniform_negs = 8, 100, 100, 100
        args.operator, args.relations, args.reg, args.entities = "none", 0, 0.0, 10_000
    if args.livejournal:
        args.dimension, args.batch_size, args.batch_negs, args.uniform_negs = 100, 10_000, 1000, 1000
        args.operator, args.relations, args.reg, args.entities = "none", 0, 0.0, 1_250_000
    tuned = False if args.default_malloc else keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    negs = NegativeSampling(args.batch_negs, args.uniform_negs, share_uniform_negs=not args.per_chunk_uniform)
    spec = ModelSpec(
        entity_dimensions={"entity": args.dimension},
        relations=(RelationSpec("all", "entity", "entity", operator=args.operator, all_negs=args.all_negs),),
        num_dynamic_rels=args.relations or None, comparator=args.comparator, loss_fn=args.loss,
        regularization_coef=args.reg, global_emb=False, lr=0.1, relation_lr=0.1,
        train_negatives=negs, eval_negatives=negs)
    gen = torch.Generator(device=device).manual_seed(0)
    model = EmbeddingModel(spec).to(device)
    head = make_head(StepChoice(args.step, compiled=args.compile), model, device)
    if args.core is not None:
        head = AttentionHead(FusedAttention() if args.core == "fused" else ExplicitAttention())
    optimizer = make_relation_optimizer(model)
    table = EntityTable.random(args.entities, args.dimension, generator=gen, device=device)
    num_batches = 64
    batches = [EdgeBatch(torch.randint(args.entities, (args.batch_size,), generator=gen, device=device),
                         torch.randint(args.entities, (args.batch_size,), generator=gen, device=device),
                         torch.randint(args.relations, (args.batch_size,), generator=gen, device=device)
                         if args.relations else 0)
               for _ in range(num_batches)]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step(i: int) -> StepStats:
        with precision_scope(args.precision, device):
            return train_step(model, table, table, batches[i % num_batches], optimizer, generator=gen, head=head)

    for i in range(args.warmup):
        step(i)
    sync()
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(5):
                step(i)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    totals = StepTotals()  # the trainer's step: its sums stay on the device (train_step also reads them back)
    ops = _step_ops(lambda i: add_train_step(totals, model, table, table, batches[i % num_batches], optimizer,
                                             generator=gen, head=head)) if args.ops else None
    step_times: list[float] = []
    start = time.perf_counter()
    steps = 0
    while time.perf_counter() - start < args.seconds:
        t0 = time.perf_counter()
        stats = step(steps)
        sync()
        step_times.append(time.perf_counter() - t0)
        steps += 1
    elapsed = time.perf_counter() - start
    edges_per_s = steps * args.batch_size / elapsed
    median_ms = statistics.median(step_times) * 1e3
    figures = {
        "edges_per_s": round(edges_per_s, 1),
        "edges_per_s_median_step": round(args.batch_size / (median_ms / 1e3), 1),
        "median_step_ms": round(median_ms, 2),
        "steps": steps,
        "seconds": round(elapsed, 2),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "shared_uniform_negs": not args.per_chunk_uniform,
        "malloc_tuned": tuned,
        "compiled": args.compile,
        "head": head.name,
        "precision": args.precision,
        "last_loss": round(stats.loss, 3),
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if ops:
        with precision_scope(args.precision, device):
            replayed = count_replayed_step(model, table, table, batches[0], head, optimizer)
        figures.update(ops_per_step=ops[0], compute_ops_per_step=ops[1], replayed_body_ops=replayed.computing,
                       replayed_body_ops_by_module=dict(replayed.by_module))
    print(f"train_step ({head.name}, {args.precision}): {edges_per_s:,.0f} edges/s over {steps} steps in "
          f"{elapsed:.1f} s "
          f"(median step {median_ms:.1f} ms → {figures['edges_per_s_median_step']:,.0f} edges/s; "
          f"{torch.get_num_threads()} threads, load {figures['loadavg_1m']})")
    if ops:
        by_module = ", ".join(f"{m or '(elsewhere)'} {n}" for m, n in figures["replayed_body_ops_by_module"].items())
        print(f"  {edges_per_s:,.0f} edges/s; per step {ops[1]:.0f} computing operations ({ops[0]:.0f} aten); "
              f"a replayed step's body {figures['replayed_body_ops']} ({by_module})")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def _step_ops(step: Callable[[int], object], steps: int = 8) -> tuple[float, float]:
    """``(aten operations, computing operations)`` dispatched per call of ``step`` (averaged over
    ``steps`` calls; :mod:`pbgtrain.model.op_count`'s rule)."""
    counted = count_ops(_Calls(step), calls=steps)
    return float(counted.aten), float(counted.computing)


class _Calls:
    """``step(0)``, ``step(1)``, … at each call (the batches in turn)."""

    def __init__(self, step: Callable[[int], object]) -> None:
        self.step, self.i = step, 0

    def __call__(self) -> None:
        self.step(self.i)
        self.i += 1


if __name__ == "__main__":
    raise SystemExit(main())
