"""The step of a run, made once (:func:`make_runner`) and given each batch: eager or replayed.

A :class:`StepRunner` trains one batch at a time (:meth:`StepRunner.train`: a bucket's edges on the
device and the offsets of the batch) and keeps the sums of its steps on the device
(:attr:`StepRunner.totals`). Two implementations:

- :class:`EagerRunner`: each batch cut from the bucket (padded to ``batch_size`` with
  ``--static-shapes``) and given to :func:`~pbgtrain.model.step.add_train_step`;
- :class:`ReplayRunner`: each batch copied into static buffers (edges, weights, the count of real
  edges: padding is data), then :func:`~pbgtrain.model.step.step_body` run on them by a
  :class:`Replayer`. :class:`CudaGraphReplayer` runs the first steps of each graph eagerly on a
  side stream (lazy allocations and library handles happen there), then captures the body once
  per relation and pair of tables in a CUDA graph and replays it: one launch for the whole step
  (gather, operators, head, gradients, row Adagrad, the relation optimizer, the sums). The
  learning rates, the negative sampler's state (:class:`~pbgtrain.model.counter_rng.CounterGenerator`)
  and the sums live in device memory the graph reads, refilled between replays; a swap of
  partitions (other tables) captures again. :class:`StandInReplayer`, on a CPU, calls the body
  where a GPU would capture and replay it, so every line of the driver but the capture call runs
  in the default test suite. A capture that fails (a driver, an operation that cannot be
  captured) leaves the run uncaptured, said once in :attr:`StepRunner.notes`.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from pbgtrain.model.attention import AttentionHead, attention_core
from pbgtrain.model.counter_rng import CounterGenerator
from pbgtrain.model.inputs import BucketEdges, EdgeBatch
from pbgtrain.model.model import EmbeddingModel
from pbgtrain.model.negative_scores import Head, ScoreMatrixHead
from pbgtrain.model.relation_adagrad import RelationAdagrad
from pbgtrain.model.score_kernels import EAGER, compiled_kernels
from pbgtrain.model.step import StepTotals, add_train_step, step_body
from pbgtrain.model.step_choice import StepChoice
from pbgtrain.model.tables import EntityTable

Body = Callable[[], None]


class StepRunner(Protocol):
    """One run's training step (see the module doc)."""

    head: Head
    totals: StepTotals
    notes: list[str]  # what the run should say once (a capture that failed); the caller empties it

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


class Replayer(Protocol):
    """How :class:`ReplayRunner` runs a step's body: ``warmup_steps`` eagerly (:meth:`eager`),
    then captured once (:meth:`capture`) and its result called for every later step."""

    warmup_steps: int

    def eager(self, body: Body) -> None: ...

    def capture(self, body: Body) -> Body: ...


class StandInReplayer:
    """A CPU's stand-in: the body itself, in place of its capture."""

    warmup_steps = 1

    def eager(self, body: Body) -> None:
        body()

    def capture(self, body: Body) -> Body:
        return body


class CudaGraphReplayer:
    """CUDA graphs sharing one memory pool; warm-up steps on a side stream, as capture wants."""

    warmup_steps = 3

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self.pool = torch.cuda.graph_pool_handle()

    def eager(self, body: Body) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            body()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def capture(self, body: Body) -> Body:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            body()
        return graph.replay


@dataclass
class _Graph:
    """One captured step: its tables (held weakly: a partition swapped out is freed, and a graph
    whose tables are gone or moved is stale), the relation parameters it trains (their step
    counts are added on the host), and the replay (None until captured)."""

    lhs: weakref.ref[EntityTable]
    rhs: weakref.ref[EntityTable]
    pointers: tuple[int, int]
    eager_steps: int = 0
    trained: list[Tensor] = field(default_factory=list)
    replay: Body | None = None

    @classmethod
    def of(cls, lhs_table: EntityTable, rhs_table: EntityTable) -> _Graph:
        return cls(weakref.ref(lhs_table), weakref.ref(rhs_table), _pointers(lhs_table, rhs_table))

    def serves(self, lhs_table: EntityTable, rhs_table: EntityTable) -> bool:
        return self.lhs() is lhs_table and self.rhs() is rhs_table and self.pointers == _pointers(lhs_table, rhs_table)


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


class ReplayRunner:
    """Static buffers, a graph per relation and pair of tables, replayed (see the module doc)."""

    def __init__(self, model: EmbeddingModel, optimizer: RelationAdagrad | None, head: Head, device: torch.device,
                 batch_size: int, replayer: Replayer) -> None:
        self.model, self.optimizer, self.head = model, optimizer, head
        self.replayer = replayer
        self.generator = CounterGenerator(device)
        self.buffers = _StaticBatch(batch_size, device)
        self.totals = StepTotals()
        self.notes: list[str] = []
        self.row_lr = torch.tensor(model.spec.lr, device=device)
        self.relation_lr = torch.tensor(self._relation_rate(), device=device)
        self._rates = (model.spec.lr, self._relation_rate())
        self._graphs: dict[int | None, _Graph] = {}
        self._uncaptured: str | None = None  # why capture failed (then every step runs eagerly)

    def _relation_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def _refill_rates(self) -> None:
        rates = (self.model.spec.lr, self._relation_rate())
        if rates != self._rates:  # --lr-decay changed them: the graph reads the new values from the same memory
            self.row_lr.fill_(rates[0])
            self.relation_lr.fill_(rates[1])
            self._rates = rates

    def train(self, edges: BucketEdges, idx: Tensor, rel: int | None, lhs_table: EntityTable,
              rhs_table: EntityTable) -> None:
        self.buffers.fill(edges, idx, relations=rel is None)
        self._refill_rates()
        graph = self._graphs.get(rel)
        if graph is None or not graph.serves(lhs_table, rhs_table):
            graph = self._graphs[rel] = _Graph.of(lhs_table, rhs_table)
        if self._uncaptured is not None or graph.eager_steps < self.replayer.warmup_steps:
            self.replayer.eager(self._body(rel, lhs_table, rhs_table))
            if graph.eager_steps == 0:
                graph.trained = [p for p in self.model.parameters() if p.grad is not None]
            graph.eager_steps += 1
        else:
            if graph.replay is None:  # the body is made where it runs: a replay needs none
                graph.replay = self._capture(self._body(rel, lhs_table, rhs_table))
            graph.replay()
        if self.optimizer is not None:
            self.optimizer.count_steps(graph.trained)
        self.totals.steps += 1

    def _capture(self, body: Body) -> Body:
        try:
            return self.replayer.capture(body)
        except Exception as exc:  # a driver or an operation that cannot be captured: go on uncaptured
            self._uncaptured = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self.notes.append(f"the step could not be captured as a CUDA graph ({self._uncaptured}); training goes "
                              "on with the same step uncaptured")
            return lambda: self.replayer.eager(body)

    def _body(self, static_rel: int | None, lhs_table: EntityTable, rhs_table: EntityTable) -> Body:
        model, batch = self.model, self.buffers.batch(static_rel)

        def body() -> None:
            step_body(self.totals, model, lhs_table, rhs_table, batch, self.optimizer, generator=self.generator,
                      negatives=model.spec.train_negatives, head=self.head, row_lr=self.row_lr,
                      relation_lr=self.relation_lr)

        return body
