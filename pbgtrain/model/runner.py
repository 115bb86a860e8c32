"""The step of a run, made once (:func:`make_runner`) and given each batch: eager or replayed.

A :class:`StepRunner` trains one batch at a time (:meth:`StepRunner.train`: a bucket's edges on the
device and the offsets of the batch) and keeps the sums of its steps on the device
(:attr:`StepRunner.totals`). Two implementations:

- :class:`EagerRunner`: each batch cut from the bucket (padded to ``batch_size`` with
  ``--static-shapes``) and given to :func:`~pbgtrain.model.step.add_train_step`;
- :class:`ReplayRunner`: each batch copied into static buffers (edges, weights, the count of real
  edges: padding is data), then :func:`~pbgtrain.model.step.step_body` run on them by a
  :class:`~pbgtrain.model.replayers.Replayer`: eagerly, or captured once and replayed. The learning rates, the negative
  sampler's state (:class:`~pbgtrain.model.counter_rng.CounterGenerator`) and the sums live in
  device memory the graph reads, refilled between replays.

What the replay driver decides, every line of it run on a CPU by :class:`~pbgtrain.model.replayers.StandInReplayer` (the
body itself in place of its capture) and by the tests' replayers:

- **Warm-up**: a relation's first :attr:`~pbgtrain.model.replayers.Replayer.warmup_steps` steps
  run eagerly, once per run (lazy allocations and library handles happen there, outside any capture), and its first step
  on each pair of tables (:data:`PAIR_WARMUP_STEPS`): what the step makes once per table or per
  tables' size and keeps (a table's row positions, the negatives' bounds, copied from the host)
  must not be made in a capture, where it would live in the graphs' shared pool, written by one
  graph's replay and read by the others'.
- **Graphs**: one per relation and pair of tables, captured at the step after that and kept
  while both tables live (held weakly: a partition parked in device memory comes back to its
  graph and replays at once; one freed takes its graphs with it), at most ``max_graphs`` pairs
  remembered (the least recently trained forgotten first).
- **Failures**: a capture that fails leaves its relation uncaptured for the rest of the run; the
  other relations still capture (their bodies differ: another operator, other tables' sizes; a
  cause common to all costs one failed capture per relation). The run's note
  (:attr:`StepRunner.notes`) gives the exception chain to its root cause, once per root cause.
  A capture that recorded nothing (:class:`~pbgtrain.model.replayers.EmptyGraphError`) is refused: its work ran outside
  the graph, and every replay would do nothing.
- **Rates**: a relation optimizer whose param groups have different rates (a state loaded with
  them: one tensor cannot hold them all) trains those steps eagerly with each group's own rate,
  and says so once.

How a GPU captures (device, stream, error mode, pool, failures): :mod:`pbgtrain.model.replayers`.
Memory: each capture starts with torch's ``empty_cache``, which gives back what the eager
warm-ups cached on the side stream; the pool then holds one step's working set for as long as
graphs live, and a later relation's warm-up caches at most one more beside it until its capture.

>>> from pbgtrain.model.model import EmbeddingModel, ModelSpec, RelationSpec
>>> from pbgtrain.model.inputs import BucketEdges
>>> spec = ModelSpec({"e": 4}, (RelationSpec("r", "e", "e"),), comparator="dot", loss_fn="softmax")
>>> model = EmbeddingModel(spec)
>>> runner = make_runner(StepChoice("attention", capture="stand-in"), model, None, torch.device("cpu"), 8)
>>> table = EntityTable.random(10, 4, generator=torch.Generator().manual_seed(0))
>>> edges = BucketEdges(torch.arange(10), torch.arange(10).flip(0), torch.zeros(10, dtype=torch.long), None, None, None)
>>> runner.reseed(1)
>>> runner.train(edges, torch.arange(5), 0, table, table)
>>> runner.totals.take().count
5
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from pbgtrain.model.attention import AttentionHead, attention_core
from pbgtrain.model.counter_rng import CounterGenerator
from pbgtrain.model.inputs import BucketEdges, EdgeBatch
from pbgtrain.model.model import EmbeddingModel
from pbgtrain.model.negative_scores import Head, ScoreMatrixHead
from pbgtrain.model.relation_adagrad import RelationAdagrad
from pbgtrain.model.replayers import Body, CudaGraphReplayer, EmptyGraphError, Replayer, StandInReplayer, failure_chain
from pbgtrain.model.score_kernels import EAGER, compiled_kernels
from pbgtrain.model.step import StepTotals, add_train_step, step_body
from pbgtrain.model.step_choice import StepChoice
from pbgtrain.model.tables import EntityTable

PAIR_WARMUP_STEPS = 1
"""Eager steps of a relation on a pair of tables before a capture on them (see the module doc)."""

MAX_GRAPHS = 128
"""Pairs of tables (per relation) a :class:`ReplayRunner` remembers by default, with their graphs."""


class StepRunner(Protocol):
    """One run's training step (see the module doc)."""

    head: Head
    totals: StepTotals
    notes: list[str]  # what the run should say once (a capture that failed, and why); the caller empties it

    def reseed(self, seed: int) -> None:
        """Start the uniform negatives' stream of ``seed`` (each bucket of each iteration has its own)."""

    def train(self, edges: BucketEdges, idx: Tensor, rel: int | None, lhs_table: EntityTable,
              rhs_table: EntityTable) -> None:
        """Train the batch ``idx`` (offsets into ``edges``) of relation ``rel`` (None with dynamic
        relations: each edge's own, from ``edges.rel``)."""


def make_head(choice: StepChoice, model: EmbeddingModel, device: torch.device) -> Head:
    """The head ``choice`` names, for ``model`` on ``device``."""
    if choice.head == "attention":
        return AttentionHead(attention_core(device, max(model.spec.entity_dimensions.values())))
    return ScoreMatrixHead(compiled_kernels() if choice.compiled else EAGER)


def make_runner(choice: StepChoice, model: EmbeddingModel, optimizer: RelationAdagrad | None, device: torch.device,
                batch_size: int, *, generator: torch.Generator | None = None,
                static_shapes: bool = False) -> StepRunner:
    """The runner of ``choice``. ``generator``: the run's torch generator, which today's eager
    step draws its negatives from (the attention form and a replayed step draw from a
    :class:`~pbgtrain.model.counter_rng.CounterGenerator` of their own)."""
    head = make_head(choice, model, device)
    decaying = optimizer is not None and any(group["lr_decay"] for group in optimizer.param_groups)
    if choice.capture == "none" or decaying:
        draws: torch.Generator | CounterGenerator = CounterGenerator(device) if choice.head == "attention" else \
            generator or torch.Generator(device=device)
        runner = EagerRunner(model, optimizer, head, draws, batch_size if static_shapes else None)
        if choice.capture != "none":  # a state loaded from torch's Adagrad with lr_decay: its rate needs the host
            runner.notes.append("the step is not replayed: the relation optimizer's state decays its rate with the "
                                "step count (lr_decay), which the host computes")
        return runner
    replayer: Replayer = CudaGraphReplayer(device) if choice.capture == "cuda-graph" else StandInReplayer()
    return ReplayRunner(model, optimizer, head, device, batch_size, replayer)


class EagerRunner:
    """Each batch cut from the bucket and trained by :func:`~pbgtrain.model.step.add_train_step`
    (``pad_to``: padded to that many rows first, the static shapes of ``--static-shapes``)."""

    def __init__(self, model: EmbeddingModel, optimizer: RelationAdagrad | None, head: Head,
                 generator: torch.Generator | CounterGenerator, pad_to: int | None) -> None:
        self.model, self.optimizer, self.head = model, optimizer, head
        self.generator = generator
        self.pad_to = pad_to
        self.totals = StepTotals()
        self.notes: list[str] = []

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def train(self, edges: BucketEdges, idx: Tensor, rel: int | None, lhs_table: EntityTable,
              rhs_table: EntityTable) -> None:
        rel_of: int | Tensor = edges.rel[idx] if rel is None else rel
        batch = edges.batch(idx, rel_of, *self.model.spec.featurized_sides(self.model.relation(rel_of)))
        if self.pad_to is not None:
            batch = batch.pad(self.pad_to)
        add_train_step(self.totals, self.model, lhs_table, rhs_table, batch, self.optimizer,
                       generator=self.generator, head=self.head)


@dataclass
class _Pair:
    """A relation's pair of tables: the tables (held weakly: a partition swapped out is freed,
    and a pair whose tables are gone or moved is stale), its eager steps, its captured step."""

    lhs: weakref.ref[EntityTable]
    rhs: weakref.ref[EntityTable]
    pointers: tuple[int, int]
    eager_steps: int = 0
    replay: Body | None = None

    @classmethod
    def of(cls, lhs_table: EntityTable, rhs_table: EntityTable) -> _Pair:
        return cls(weakref.ref(lhs_table), weakref.ref(rhs_table), _pointers(lhs_table, rhs_table))

    def serves(self, lhs_table: EntityTable, rhs_table: EntityTable) -> bool:
        return self.lhs() is lhs_table and self.rhs() is rhs_table and self.pointers == _pointers(lhs_table, rhs_table)

    def stale(self) -> bool:
        lhs, rhs = self.lhs(), self.rhs()
        return lhs is None or rhs is None or self.pointers != _pointers(lhs, rhs)


def _pointers(lhs_table: EntityTable, rhs_table: EntityTable) -> tuple[int, int]:
    return lhs_table.weights.data_ptr(), rhs_table.weights.data_ptr()


class _StaticBatch:
    """A batch's edges in buffers of ``size`` rows that every step reads (the rows past the
    count are padding: entity 0, relation 0, weight 0)."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.lhs = torch.zeros(size, dtype=torch.long, device=device)
        self.rhs = torch.zeros(size, dtype=torch.long, device=device)
        self.rel = torch.zeros(size, dtype=torch.long, device=device)
        self.weight = torch.zeros(size, device=device)
        self.count = torch.zeros((), dtype=torch.long, device=device)

    def fill(self, edges: BucketEdges, idx: Tensor, *, relations: bool) -> None:
        """Copy the edges ``idx`` in, their relation ids too when ``relations`` (dynamic relations;
        on the device: gathers and fills, no synchronisation)."""
        n = len(idx)
        if n > len(self.lhs):
            raise ValueError(f"a batch of {n} edges is larger than the step's {len(self.lhs)} rows (batch_size)")
        pairs = [(edges.lhs, self.lhs), (edges.rhs, self.rhs)] + ([(edges.rel, self.rel)] if relations else [])
        for source, target in pairs:
            torch.index_select(source, 0, idx, out=target[:n])
            target[n:].zero_()
        if edges.weight is None:
            self.weight[:n].fill_(1.0)
        else:
            torch.index_select(edges.weight, 0, idx, out=self.weight[:n])
        self.weight[n:].zero_()
        self.count.fill_(n)

    def batch(self, rel: int | None) -> EdgeBatch:
        return EdgeBatch(self.lhs, self.rhs, self.rel if rel is None else rel, self.weight, num_real=self.count)


PairKey = tuple[int | None, int, int]  # relation, id of each table


class ReplayRunner:
    """Static buffers, a graph per relation and pair of tables, replayed (see the module doc)."""

    def __init__(self, model: EmbeddingModel, optimizer: RelationAdagrad | None, head: Head, device: torch.device,
                 batch_size: int, replayer: Replayer, *, max_graphs: int = MAX_GRAPHS) -> None:
        self.model, self.optimizer, self.head = model, optimizer, head
        self.replayer = replayer
        self.max_graphs = max_graphs
        self.generator = CounterGenerator(device)
        self.buffers = _StaticBatch(batch_size, device)
        self.totals = StepTotals()
        self.notes: list[str] = []
        group_rates = self._group_rates()
        self.row_lr = torch.tensor(model.spec.lr, device=device)
        self.relation_lr = torch.tensor(group_rates[0], device=device)
        self._rates = (model.spec.lr, group_rates[0])
        self._relation_steps: dict[int | None, int] = {}  # eager steps of each relation
        self._trained: dict[int | None, list[Tensor]] = {}  # the parameters each relation trains
        self._pairs: OrderedDict[PairKey, _Pair] = OrderedDict()  # least recently trained first
        self._uncaptured: dict[int | None, str] = {}  # relations whose capture failed, and why
        self._said: set[str] = set()  # root causes already in a note

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    @property
    def captured(self) -> int:
        """Graphs held now."""
        return sum(pair.replay is not None for pair in self._pairs.values())

    def _group_rates(self) -> tuple[float, ...]:
        return tuple(float(g["lr"]) for g in self.optimizer.param_groups) if self.optimizer is not None else (0.0,)

    def _refill_rates(self) -> bool:
        """Refill the rates the step reads where they changed (``--lr-decay``: the graph reads the
        new values from the same memory); False when the relation optimizer's groups have rates of
        their own, which the one rate tensor cannot give."""
        group_rates = self._group_rates()
        if len(set(group_rates)) > 1:
            self._say(f"groups:{group_rates}", f"the relation optimizer's parameter groups have different rates "
                      f"({', '.join(f'{r:g}' for r in group_rates)}): those steps are not replayed, each group "
                      "trains at its own rate")
            return False
        rates = (self.model.spec.lr, group_rates[0])
        if rates != self._rates:
            self.row_lr.fill_(rates[0])
            self.relation_lr.fill_(rates[1])
            self._rates = rates
        return True

    def train(self, edges: BucketEdges, idx: Tensor, rel: int | None, lhs_table: EntityTable,
              rhs_table: EntityTable) -> None:
        self.buffers.fill(edges, idx, relations=rel is None)
        if not self._refill_rates():
            self.replayer.eager(self._body(rel, lhs_table, rhs_table, group_rates=True))  # counts its own steps
            self.totals.steps += 1
            return
        pair = self._pair(rel, lhs_table, rhs_table)
        if pair.replay is not None:
            pair.replay()
        elif rel in self._uncaptured or pair.eager_steps < PAIR_WARMUP_STEPS or \
                self._relation_steps[rel] < self.replayer.warmup_steps:
            self.replayer.eager(self._body(rel, lhs_table, rhs_table))
            self._trained.setdefault(rel, [p for p in self.model.parameters() if p.grad is not None])
            self._relation_steps[rel] = self._relation_steps.get(rel, 0) + 1
            pair.eager_steps += 1
        else:
            pair.replay = self._capture_and_step(rel, lhs_table, rhs_table)
        if self.optimizer is not None:
            self.optimizer.count_steps(self._trained[rel])
        self.totals.steps += 1

    def _pair(self, rel: int | None, lhs_table: EntityTable, rhs_table: EntityTable) -> _Pair:
        """The record of ``rel`` on these tables (a new one where the tables are new, or the
        record's are gone or moved), made the most recently trained."""
        key: PairKey = (rel, id(lhs_table), id(rhs_table))
        pair = self._pairs.get(key)
        if pair is None or not pair.serves(lhs_table, rhs_table):
            for stale in [k for k, p in self._pairs.items() if p.stale()]:  # their graphs freed with them
                del self._pairs[stale]
            pair = self._pairs[key] = _Pair.of(lhs_table, rhs_table)
            while len(self._pairs) > self.max_graphs:
                self._pairs.popitem(last=False)
        self._pairs.move_to_end(key)
        self._relation_steps.setdefault(rel, 0)
        return pair

    def _capture_and_step(self, rel: int | None, lhs_table: EntityTable, rhs_table: EntityTable) -> Body | None:
        """Capture the step on these tables and replay it once (this batch's step); None when the
        capture failed (the step then done eagerly, unless it ran outside an empty graph)."""
        body = self._body(rel, lhs_table, rhs_table)
        try:
            replay = self.replayer.capture(body)
        except EmptyGraphError as exc:  # its work ran, outside the graph: the step is done
            self._uncapture(rel, exc)
            return None
        except Exception as exc:  # a driver, an operation that cannot be captured, memory: the step is not done
            self._uncapture(rel, exc)
            self.replayer.eager(body)
            return None
        replay()
        return replay

    def _uncapture(self, rel: int | None, exc: Exception) -> None:
        chain = failure_chain(exc)
        self._uncaptured[rel] = chain[-1]
        subject = "the step" if rel is None else f"the step of relation {self.model.spec.relations[rel].name!r}"
        others = "" if rel is None else " (and of any other relation whose capture fails the same way)"
        self._say(f"capture:{chain[-1]}", f"{subject}{others} could not be captured as a CUDA graph: "
                  f"{' ← caused by '.join(chain)}; it trains uncaptured from now on")

    def _say(self, cause: str, note: str) -> None:
        if cause not in self._said:
            self._said.add(cause)
            self.notes.append(note)

    def _body(self, static_rel: int | None, lhs_table: EntityTable, rhs_table: EntityTable, *,
              group_rates: bool = False) -> Body:
        """The step on the buffers. Its tables are held weakly: a body kept as the stand-in's
        "capture" keeps no partition alive after its swap (a graph replays only on live tables).
        ``group_rates``: the relation optimizer's own step (each group's rate; it counts its steps)."""
        model, batch = self.model, self.buffers.batch(static_rel)
        lhs_ref, rhs_ref = weakref.ref(lhs_table), weakref.ref(rhs_table)
        relation_lr = None if group_rates else self.relation_lr

        def body() -> None:
            lhs, rhs = lhs_ref(), rhs_ref()
            if lhs is None or rhs is None:
                raise RuntimeError("a step replayed on tables that were freed")  # _Pair.serves prevents it
            step_body(self.totals, model, lhs, rhs, batch, self.optimizer, generator=self.generator,
                      negatives=model.spec.train_negatives, head=self.head, row_lr=self.row_lr,
                      relation_lr=relation_lr)

        return body
