"""``tools/bench_gpu.py --check``: every GPU line of the fused, captured step with its target, one run.

The lines (each printed with what it measured, its target, the run's peak GPU memory and whether
the target is met), then every run's notes (:attr:`pbgtrain.model.runner.StepRunner.notes`: a
capture that failed, a step not replayed; "none" when the run said nothing):

1. **LiveJournal shape** (4.8M entities, 68M edges, one partition, one relation, operator none,
   d100, dot, softmax, 1,000 same-batch + 1,000 uniform negatives per side, row Adagrad, bf16):
   edges/s at batch 10,000 (target ≥ 15M) and 50,000 (≥ 20M).
2. **Freebase86m's shape** (86M entities, 338M edges resident on the card, 14,824 dynamic
   relations, ComplEx d100, one partition, batch 50,000, the same negatives, bf16): the time 10
   epochs take at the measured rate (target ≤ 6 minutes).
3. **FB15k-237, 1-vs-all** (the recipe's model at dimension 2,000, batch 1,000, bf16): seconds
   per epoch (≤ 0.5) and the filtered test MRR after the check's training time (the target is
   .37 within 10 minutes of training; the check trains ``--check-fb15k-minutes`` and judges the
   figure at that minute: :func:`mrr_verdict`).
4. **A partitioned fit** (:data:`PARTITIONED`: the LiveJournal model on a planted graph of 2M
   entities and 20M edges in 4 partitions, 16 buckets, every swap through the disk with the next
   bucket's partitions read ahead in the background while the step is captured): edges/s, and
   the target that every bucket trained replayed with nothing noted (issue 55's first
   prediction: pinning memory while a graph is captured).

Lines 1 and 2 run the product's step as the trainer runs it (:func:`pbgtrain.model.runner.make_runner`
with :func:`check_step`: on a GPU the step ``--step auto`` takes, the attention form replayed as a
CUDA graph; a bucket's edges resident on the device, batches sliced from a shuffled order there),
on random tables and edges made on the device: no files. Line 3 is ``pbgtrain fit`` and
``pbgtrain eval`` on the FB15k-237 layout, imported beforehand on a CPU machine (:func:`prepare`;
``tools/card_kit.py prepare`` puts it in the card kit: the card's image may lack polars). Line 4
is ``pbgtrain fit`` on a graph written on the spot (:func:`pbgio.testing.planted.planted_graph`:
numpy and h5py only). Each run starts with the card's peak-memory counter reset, so each line's
peak is its own. The notes of ``fit``'s runs are the ``note:`` lines it prints
(:class:`NoteCollector`).

``--device cpu --scale 0.001`` runs the same code on a CPU at a thousandth of the size, batches
and negatives shrinking with the graphs (:func:`batch_shape`; ``tools/card_run.py --device cpu``
is that smoke run, with FB15k-237 cut down too): the figures mean nothing there.
:func:`check_step` runs the GPU's step there through the replay driver with its CPU stand-in
(``--step attention --capture``), which ``--step auto`` never takes on a CPU, so the smoke run
drives every line of the replay path but the capture call.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

import torch

LIVEJOURNAL = {"entities": 4_847_571, "edges": 68_993_773}
FREEBASE86M = {"entities": 86_054_151, "edges": 338_586_276, "relations": 14_824}
PARTITIONED = {"entities": 2_000_000, "edges": 20_000_000, "partitions": 4}
FB15K_BATCH = 1000
MRR_TARGET, MRR_MINUTES = 0.37, 10.0
GIB = 1 << 30


def batch_shape(target: int, edges: int, per: int = 256) -> tuple[int, int]:
    """A line's batch and negatives per side (same-batch and uniform, each): ``target`` and 1,000
    on the full-size graphs; on a smaller one (``--scale``) the batch shrinks to ``1/per`` of its
    edges (a multiple of 10) and the negatives to a tenth of the batch, so that a smoke run is
    small in every dimension (a step's work grows with batch × negatives).

    >>> batch_shape(10_000, 68_993_773), batch_shape(50_000, 338_586_276), batch_shape(10_000, 68_993)
    ((10000, 1000), (50000, 1000), (260, 26))
    """
    batch = max(min(target, edges // per) // 10 * 10, 10)
    return batch, min(1000, batch // 10)


@dataclass(frozen=True)
class Line:
    """One line of the check: what it measured against its target. ``met`` is None where nothing
    is judged (a smoke run on a CPU; a figure that decides nothing yet, ``verdict`` says why)."""

    what: str
    measured: str
    target: str
    met: bool | None
    verdict: str = ""  # the verdict cell when ``met`` is None for a reason other than a CPU
    notes: tuple[str, ...] = ()  # the run's notes (the runner's: a capture that failed, …)
    peak_gpu_bytes: int | None = None  # the run's own peak (the counter reset before it)
    step: str = ""  # the step the run took, in words
    run: str = ""  # the run the line comes from (two lines may share one)

    def cells(self) -> list[str]:
        verdict = (self.verdict or "-") if self.met is None else ("met" if self.met else "NOT met")
        peak = "-" if self.peak_gpu_bytes is None else f"{self.peak_gpu_bytes / GIB:.1f}"
        return [self.what, self.measured, self.target, peak, verdict]


HEADER = ["line", "measured", "target", "peak GPU GiB", ""]


def rate(edges_per_s: float) -> str:
    """Edges/s in millions (a card's), or thousands (a smoke run's).

    >>> rate(18.6e6), rate(21_450.0)
    ('18.60M edges/s', '21.4k edges/s')
    """
    return f"{edges_per_s / 1e6:.2f}M edges/s" if edges_per_s >= 1e6 else f"{edges_per_s / 1e3:.1f}k edges/s"


def check_step(config: Any, device: torch.device) -> Any:
    """The step the check runs ``config`` with: on a GPU what ``--step auto`` takes (the attention
    form replayed as a CUDA graph, wherever it applies); on a CPU the same form through the
    replay driver with its stand-in (``--step attention --capture``: ``auto`` takes neither there).

    >>> from types import SimpleNamespace
    >>> cfg = SimpleNamespace(loss_fn="softmax", comparator="dot", bias=False, max_norm=None,
    ...     dynamic_relations=False, relations=[SimpleNamespace(operator="none", all_negs=False)], num_machines=1,
    ...     featurized_types=list, batch_size=100, num_batch_negs=10, num_uniform_negs=10)
    >>> choice = check_step(cfg, torch.device("cpu"))
    >>> choice.head, choice.capture
    ('attention', 'stand-in')
    """
    from pbgtrain.training.fit_plan import resolve_step

    return resolve_step(**fit_step(device), compile_step=False, cfg=config, device=device)


def fit_step(device: torch.device) -> dict[str, Any]:
    """``--step`` and ``--capture`` of the check's runs on ``device`` (see :func:`check_step`)."""
    cuda = device.type == "cuda"
    return {"requested": "auto" if cuda else "attention", "capture": None if cuda else True}


def fresh_peak(device: torch.device) -> None:
    """Free what earlier runs left and reset the card's peak-memory counter, so that the next
    run's peak is its own (without this it is the largest of every run so far)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> int | None:
    """The peak GPU memory allocated since :func:`fresh_peak` (None on a CPU)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


class NoteCollector(io.TextIOBase):
    """A text stream that passes everything on to ``echo`` and keeps the lines ``fit`` prints of
    what ran differently: ``note: …`` (the runner's notes, said once per bucket that had any,
    and others of the run; indented lines after one belong to it) and its ``step: …`` line.
    ``fit`` prints them to stderr, so a run under ``contextlib.redirect_stderr(collector)`` is
    heard whole.

    >>> collector = NoteCollector(io.StringIO())
    >>> _ = collector.write("step: score matrices\\nnote: the step could not be captured (x)\\n  caused by: y\\nepo")
    >>> _ = collector.write("ch 1\\n")
    >>> collector.step, collector.notes
    ('score matrices', ['the step could not be captured (x)\\n  caused by: y'])
    """

    def __init__(self, echo: TextIO) -> None:
        super().__init__()
        self.echo = echo
        self.notes: list[str] = []
        self.step = ""
        self._partial = ""
        self._in_note = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.echo.write(text)
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith("note: "):
                self.notes.append(line[len("note: "):])
                self._in_note = True
            elif self._in_note and line[:1].isspace():  # a note of several lines (a cause, its chain)
                self.notes[-1] += "\n" + line
            else:
                self._in_note = False
                if line.startswith("step: "):
                    self.step = line[len("step: "):]
        return len(text)

    def flush(self) -> None:
        self.echo.flush()


@contextlib.contextmanager
def heard(echo: TextIO) -> Any:
    """``fit``'s stderr passed on to ``echo`` and collected (:class:`NoteCollector`)."""
    collector = NoteCollector(echo)
    with contextlib.redirect_stderr(collector):
        yield collector


def step_rate(*, entities: int, edges: int, relations: int, operator: str, batch_size: int, negatives: int,
              device: torch.device, seconds: float, seed: int = 0) -> dict[str, Any]:
    """Edges/s of the run's step on one resident partition (:func:`check_step`), batches of
    ``batch_size`` sliced from a shuffled order of the edges on the device, measured over
    ``seconds`` after the first batches (warm-up and capture); the runner's notes and the run's
    peak GPU memory with it."""
    from pbgtrain.model import BucketEdges, EmbeddingModel, EntityTable, ModelSpec, NegativeSampling, RelationSpec
    from pbgtrain.model.model import make_relation_optimizer
    from pbgtrain.model.precision import precision_scope
    from pbgtrain.model.runner import make_runner

    fresh_peak(device)
    dynamic = relations > 1
    negs = NegativeSampling(negatives, negatives)
    spec = ModelSpec({"entity": 100}, (RelationSpec("rel", "entity", "entity", operator=operator),),
                     num_dynamic_rels=relations if dynamic else None, comparator="dot", loss_fn="softmax",
                     global_emb=False, lr=0.1, relation_lr=0.1, train_negatives=negs, eval_negatives=negs)
    config = SimpleNamespace(loss_fn="softmax", comparator="dot", bias=False, max_norm=None,
                             dynamic_relations=dynamic, relations=[SimpleNamespace(operator=operator, all_negs=False)],
                             num_machines=1, featurized_types=list, batch_size=batch_size, num_batch_negs=negatives,
                             num_uniform_negs=negatives)
    choice = check_step(config, device)
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
    cuda = device.type == "cuda"
    # batches before the clock starts: a GPU's warm-up and capture; a CPU's stand-in captures at its
    # second step, and a CPU has no queue to drain: its clock is read after every batch
    warm = min(8 if cuda else 2, max(num_batches // 2, 1))
    every = 16 if cuda else 1

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    trained = 0
    started = 0.0
    with precision_scope("bf16", device):
        for k in range(num_batches * 100):  # as many epochs as the time asks for
            if k == warm:
                sync()
                started, trained = time.perf_counter(), 0
            if k > warm and (k - warm) % every == 0:
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
    return {"edges_per_s": trained / elapsed, "seconds": elapsed, "step": choice.note.removeprefix("step: "),
            "capture": choice.capture,
            "notes": list(runner.notes), "peak_gpu_bytes": peak_bytes(device)}


def prepare(root: Path) -> Path:
    """FB15k-237 imported with its recipe (a CPU machine, with polars, as the quality benchmark
    does: :func:`bench_quality.prepare`) into ``root/fb15k-237``: its config and the layout's
    ``data/`` only (7.4 MiB; the unpacked TSV files stay behind). Reused when present. The
    config's path."""
    from bench_quality import prepare as prepare_recipe

    dest = root / "fb15k-237"
    if (dest / "data" / "dynamic_rel_count.txt").is_file() and (dest / "config.json").is_file():
        return dest / "config.json"
    with tempfile.TemporaryDirectory(prefix="fb15k-237-") as scratch:
        work = prepare_recipe(Path(scratch), "fb15k-237")
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        shutil.copy(work / "config.json", dest / "config.json")
        shutil.copytree(work / "data", dest / "data")
    return dest / "config.json"


def mrr_verdict(mrr: float, minutes: float, target: float = MRR_TARGET, within: float = MRR_MINUTES) -> bool | None:
    """The MRR target (``target`` within ``within`` minutes of training) judged at the minute the
    figure was taken: met when ``mrr`` reaches it by then (no later than ``within``), not met when
    it does not by ``within``; a lower figure before ``within`` decides nothing (None), nor does a
    figure reached only after it.

    >>> mrr_verdict(0.38, 2.5), mrr_verdict(0.30, 2.5), mrr_verdict(0.30, 10.0), mrr_verdict(0.38, 12.0)
    (True, None, False, None)
    """
    if mrr >= target:
        return True if minutes <= within else None
    return False if minutes >= within else None


@dataclass(frozen=True)
class Fb15kRun:
    """How the FB15k-237 lines train and evaluate: the target's shape by default; a smoke run
    asks less (fit stops between iterations only, and an iteration is ``1/edge_chunks`` of an
    epoch)."""

    minutes: float = 2.5  # of training; the MRR line is judged at the minute it reaches
    dimension: int = 2000
    batch: int = FB15K_BATCH
    edge_chunks: int = 1
    eval_sample: int | None = None  # test edges ranked (None: all of them)


def fb15k(config: Path, device: torch.device, shape: Fb15kRun) -> tuple[Line, Line]:
    """The FB15k-237 1-vs-all lines: seconds per epoch, and the test MRR after ``shape.minutes``
    (the checkpoints written beside the layout are removed afterwards: a card kit stays its size)."""
    data = config.parent / "data"
    model = config.parent / "model"  # the recipe's checkpoint_path: scratch, removed before and after
    shutil.rmtree(model, ignore_errors=True)
    try:
        return _fb15k_lines(config, data, device, shape)
    finally:
        shutil.rmtree(model, ignore_errors=True)


def _fb15k_lines(config: Path, data: Path, device: torch.device, shape: Fb15kRun) -> tuple[Line, Line]:
    import sys

    from pbgtrain.config import load_run_config
    from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
    from pbgtrain.train import FitOptions, fit

    overrides = [f"dimension={shape.dimension}", f"batch_size={shape.batch}", "edge_paths=data/train",
                 "num_epochs=100000", f"num_edge_chunks={shape.edge_chunks}"]
    run = load_run_config(config, overrides)
    step = fit_step(device)
    fresh_peak(device)
    with heard(sys.stderr) as said:
        result = fit(run, FitOptions(device=str(device), precision="bf16", check_layout=False,
                                     max_seconds=shape.minutes * 60, operator_init="identity",
                                     step=step["requested"], capture=step["capture"]))
    peak = peak_bytes(device)
    seconds = sorted(r.seconds for r in result.iterations)
    per_epoch = seconds[len(seconds) // 2] * shape.edge_chunks
    epochs = f"{len(seconds)} epochs" if shape.edge_chunks == 1 else \
        f"{len(seconds)} iterations of 1/{shape.edge_chunks} epoch"
    trained_minutes = sum(seconds) / 60
    metrics = evaluate_checkpoint(load_run_config(config, overrides), EvalOptions(
        edge_paths=[data / "test"], filter_paths=[data / s for s in ("train", "valid", "test")],
        device=str(device), sample=shape.eval_sample)).metrics
    cpu = device.type != "cuda"
    judged = None if cpu else mrr_verdict(metrics.mrr, trained_minutes)
    undecided = "" if cpu or judged is not None else \
        f"undecided at {trained_minutes:.1f} min (--check-fb15k-minutes {MRR_MINUTES:g} decides)"
    notes = tuple(said.notes)
    sampled = "" if shape.eval_sample is None else f", {metrics.count:,} test edges sampled"
    return (Line(f"FB15k-237 1-vs-all, d{shape.dimension}, batch {shape.batch:,}, bf16: seconds per epoch",
                 f"{per_epoch:.2f} s (median of {epochs})", "≤ 0.5 s", None if cpu else per_epoch <= 0.5,
                 notes=notes, peak_gpu_bytes=peak, step=said.step, run="fb15k-237"),
            Line("FB15k-237 1-vs-all: filtered test MRR",
                 f"{metrics.mrr:.4f} after {trained_minutes:.1f} min ({epochs}{sampled})",
                 f"≥ {MRR_TARGET:g} within {MRR_MINUTES:g} min, judged at {trained_minutes:.1f}", judged, undecided,
                 notes=notes, peak_gpu_bytes=peak, step=said.step, run="fb15k-237"))


def partitioned(root: Path, device: torch.device, scale: float, seed: int = 0,
                parts: int = PARTITIONED["partitions"]) -> tuple[Line, dict[str, Any]]:
    """The partitioned line: ``pbgtrain fit`` of one epoch on a planted graph of
    :data:`PARTITIONED`'s shape × ``scale`` in ``parts`` partitions, written under ``root``, every
    swap through the disk (``--partition-memory 0``) with the next bucket's partitions read ahead
    in the background (on a GPU into page-locked memory, while the step is captured)."""
    import sys

    from pbgio.testing.planted import planted_graph
    from pbgtrain.config import load_run_config
    from pbgtrain.train import FitOptions, fit

    shape = {k: max(int(v * scale), 1000) for k, v in PARTITIONED.items() if k != "partitions"}
    batch_size, negatives = batch_shape(10_000, shape["edges"] // parts ** 2, per=4)
    config = planted_graph(root / "partitioned", num_partitions=parts, num_nodes=shape["entities"],
                           num_edges=shape["edges"], num_relations=1, num_communities=1000, seed=seed,
                           relations=[{"name": "r0", "lhs": "node", "rhs": "node", "operator": "none"}],
                           dimension=100, batch_size=batch_size, num_batch_negs=negatives,
                           num_uniform_negs=negatives, num_epochs=1, global_emb=False)
    step = fit_step(device)
    fresh_peak(device)
    with heard(sys.stderr) as said:
        result = fit(load_run_config(config), FitOptions(
            device=str(device), precision="bf16", check_layout=False, partition_memory=0.0,
            read_ahead_partitions=True, step=step["requested"], capture=step["capture"]))
    peak = peak_bytes(device)
    trained = sum(r.train.count for r in result.iterations)
    seconds = sum(r.seconds for r in result.iterations)
    loss = sum(r.train.loss for r in result.iterations) / max(trained, 1)
    movement = result.movement[0]
    cuda = device.type == "cuda"
    replayed = check_step(load_run_config(config).config, device).capture != "none"
    ok = not said.notes and replayed and movement["partitions_read_ahead"] > 0 and math.isfinite(loss)
    line = Line(f"partitioned fit ({shape['entities']:,} entities, {shape['edges']:,} edges, {parts}×{parts} "
                f"buckets, read ahead), batch {batch_size:,}, bf16",
                f"{rate(trained / max(seconds, 1e-9))}; partitions read ahead: {movement['partitions_read_ahead']}",
                "every bucket replayed, nothing noted", ok if cuda else None,
                notes=tuple(said.notes), peak_gpu_bytes=peak, step=said.step, run="partitioned")
    raw = {"edges": trained, "seconds": seconds, "loss": loss, "movement": movement, "step": said.step,
           "notes": said.notes, "replayed": replayed, "peak_gpu_bytes": peak, "batch_size": batch_size,
           "entities": shape["entities"], "edges_in_graph": shape["edges"]}
    return line, raw


@dataclass
class Check:
    """The check's lines and the raw figures of each run (``--json``)."""

    lines: list[Line] = field(default_factory=list)
    runs: dict[str, Any] = field(default_factory=dict)

    def json(self) -> str:
        return json.dumps({"lines": [asdict(line) for line in self.lines], "runs": self.runs}, indent=2) + "\n"


def report(lines: list[Line]) -> str:
    """The table of ``lines``, then each run's step and notes ("none" when it said nothing)."""
    from _benchutil import format_table

    out = [format_table(HEADER, [line.cells() for line in lines]), "", "each run's step and notes:"]
    seen = set()
    for line in lines:
        if line.run in seen:  # the two FB15k-237 lines come from one run
            continue
        seen.add(line.run)
        out.append(f"  {line.run or line.what}: step: {line.step or '-'}")
        out += [f"    note: {note}" for note in line.notes] or ["    notes: none"]
    return "\n".join(out)


def run(args: argparse.Namespace) -> list[Line]:
    device = torch.device(args.device)
    cpu = device.type != "cuda"
    check = Check()
    lj = {k: max(int(v * args.scale), 1000) for k, v in LIVEJOURNAL.items()}
    for batch, target in ((10_000, 15e6), (50_000, 20e6)):
        batch_size, negatives = batch_shape(batch, lj["edges"])
        measured = step_rate(entities=lj["entities"], edges=lj["edges"], relations=1, operator="none",
                             batch_size=batch_size, negatives=negatives, device=device, seconds=args.check_seconds)
        check.runs[f"livejournal-{batch}"] = measured
        check.lines.append(Line(f"LiveJournal shape ({lj['entities']:,} entities), batch {batch_size:,}, bf16",
                                rate(measured["edges_per_s"]), f"≥ {target / 1e6:.0f}M edges/s",
                                None if cpu else measured["edges_per_s"] >= target, notes=tuple(measured["notes"]),
                                peak_gpu_bytes=measured["peak_gpu_bytes"], step=measured["step"],
                                run=f"livejournal-{batch}"))
        print(f"  {check.lines[-1].what}: {check.lines[-1].measured} ({measured['step']})", flush=True)
    fb = {k: max(int(v * args.scale), 1000) for k, v in FREEBASE86M.items()}
    batch_size, negatives = batch_shape(50_000, fb["edges"])
    measured = step_rate(entities=fb["entities"], edges=fb["edges"], relations=fb["relations"],
                         operator="complex_diagonal", batch_size=batch_size, negatives=negatives, device=device,
                         seconds=args.check_seconds)
    check.runs["freebase86m"] = measured
    ten_epochs = 10 * fb["edges"] / measured["edges_per_s"]
    check.lines.append(Line(f"Freebase86m shape ({fb['entities']:,} entities, {fb['edges']:,} edges), ComplEx d100, "
                            f"batch {batch_size:,}: 10 epochs", f"{ten_epochs / 60:.1f} min "
                            f"({rate(measured['edges_per_s'])})", "≤ 6 min",
                            None if cpu else ten_epochs <= 360, notes=tuple(measured["notes"]),
                            peak_gpu_bytes=measured["peak_gpu_bytes"], step=measured["step"], run="freebase86m"))
    print(f"  {check.lines[-1].what}: {check.lines[-1].measured} ({measured['step']})", flush=True)
    if args.prepared is None:
        check.lines.append(Line("FB15k-237 1-vs-all", "skipped: no --prepared DIR (tools/card_kit.py prepare DIR "
                                "on a CPU machine imports it into DIR/layouts)",
                                f"≤ 0.5 s an epoch; ≥ {MRR_TARGET:g} in {MRR_MINUTES:g} min", False))
    else:
        shape = Fb15kRun(args.check_fb15k_minutes, args.check_fb15k_dimension, args.check_fb15k_batch,
                         args.check_fb15k_edge_chunks, args.check_fb15k_eval_sample or None)
        check.lines += fb15k(args.prepared / "fb15k-237" / "config.json", device, shape)
    print(f"  {check.lines[-1].what}: {check.lines[-1].measured}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        line, check.runs["partitioned"] = partitioned(Path(scratch), device, args.scale)
    check.lines.append(line)
    print(f"  {line.what}: {line.measured}", flush=True)
    print(report(check.lines), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(check.json(), encoding="utf-8")
    return check.lines
