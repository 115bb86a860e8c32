"""One training step and one evaluation step on a batch of edges.

>>> import torch
>>> from pbgtrain.model.model import ModelSpec, RelationSpec, EmbeddingModel
>>> spec = ModelSpec({"e": 4}, (RelationSpec("r", "e", "e", operator="diagonal"),), comparator="dot",
...                  loss_fn="softmax", lr=0.1, relation_lr=0.1)
>>> model = EmbeddingModel(spec)
>>> table = EntityTable.random(10, 4, generator=torch.Generator().manual_seed(0))
>>> batch = EdgeBatch(torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5]), rel=0)
>>> stats = train_step(model, table, table, batch, make_relation_optimizer(model))
>>> stats.count, stats.loss > 0
(3, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from pbgtrain.model.gradients import training_gradients
from pbgtrain.model.inputs import EdgeBatch
from pbgtrain.model.model import EmbeddingModel, NegativeSampling, make_relation_optimizer
from pbgtrain.model.negative_sampling import Draws
from pbgtrain.model.negative_scores import Head, training_head
from pbgtrain.model.relation_adagrad import ParameterOptimizer, RelationAdagrad
from pbgtrain.model.scoring import Scores, forward_batch
from pbgtrain.model.tables import EntityTable

__all__ = ["EvalResult", "StepStats", "StepTotals", "add_train_step", "batch_loss", "eval_step",
           "make_relation_optimizer", "step_body", "train_step"]


@dataclass(frozen=True)
class StepStats:
    """Sums over a batch: loss (before regularization), reg, edges, and violators per side
    (negatives scoring above their positive), counted on ``violators_counted_on`` edges: every
    edge (the default), or a sample where the step never holds the scores (the attention form)."""

    loss: float = 0.0
    reg: float = 0.0
    count: int = 0
    violators_lhs: int = 0
    violators_rhs: int = 0
    violators_counted_on: int | None = None  # None: ``count``

    @property
    def violator_edges(self) -> int:
        """The edges the violators were counted on."""
        return self.count if self.violators_counted_on is None else self.violators_counted_on

    @property
    def violators_sampled(self) -> bool:
        return self.violator_edges < self.count

    def __add__(self, other: StepStats) -> StepStats:
        counted = None if not (self.violators_sampled or other.violators_sampled) else \
            self.violator_edges + other.violator_edges
        return StepStats(self.loss + other.loss, self.reg + other.reg, self.count + other.count,
                         self.violators_lhs + other.violators_lhs, self.violators_rhs + other.violators_rhs, counted)


class StepTotals:
    """Sums of training steps kept on their device, read back only by :meth:`result`: the batch
    loop never waits for the device to report a loss (no host synchronisation per batch). The
    device sums are made at the first :meth:`add` and reused after :meth:`reset`, so that a step
    replayed as a CUDA graph adds to the same memory every time. Counts given as numbers (a batch
    without padding) are added on the host; counts on the device (a padded batch's) there.

    The device sums are one float64 vector (loss, violators lhs and rhs, edges, edges the
    violators were counted on, N3: integers exact to 2⁵³): a step gathers what it adds in one
    ``cat`` and adds it in one operation.

    >>> totals = StepTotals()
    >>> totals.add(torch.tensor(2.0), None, 4, torch.tensor([1, 0]))
    >>> totals.add(torch.tensor(1.0), torch.tensor(0.5), torch.tensor(2), torch.tensor([0, 3]))
    >>> totals.result()
    StepStats(loss=3.0, reg=0.5, count=6, violators_lhs=1, violators_rhs=3, violators_counted_on=None)
    """

    _LOSS, _VIOLATORS, _COUNTS, _REG = 0, 1, 3, 5  # where each sum sits in the vector

    def __init__(self) -> None:
        self._sums: Tensor | None = None  # float64 on the device: loss, violators lhs, rhs, edges, counted on, reg
        self._parts: Tensor | None = None  # what one step adds, gathered there
        self._host_counts = [0, 0]  # edges, edges counted on, given as numbers
        self.steps = 0

    def add(self, loss: Tensor, reg: Tensor | None, count: Tensor | int, violators: Tensor,
            counted_on: Tensor | int | None = None) -> None:
        """Add a step's loss, regularizer (None: 0), edges, violators ([lhs, rhs]; one number: to
        both) and the edges the violators were counted on (None: every edge). The device's part
        only: :attr:`steps` is the caller's to count."""
        if self._sums is None or self._parts is None:
            self._sums = torch.zeros(6, dtype=torch.float64, device=loss.device)
            self._parts = torch.empty(6, dtype=torch.float64, device=loss.device)
        counted = count if counted_on is None else counted_on
        parts = [loss.view(1), violators.expand(2)]
        if isinstance(count, Tensor) and isinstance(counted, Tensor):  # padded: the counts are data
            parts += [count.view(1), counted.view(1)]
            if reg is not None:
                parts.append(reg.view(1))
                reg = None
        else:
            for i, value in enumerate((count, counted)):
                if isinstance(value, Tensor):
                    self._sums[self._COUNTS + i].add_(value)
                else:
                    self._host_counts[i] += value
        size = sum(part.numel() for part in parts)
        torch.cat(parts, out=self._parts[:size])
        self._sums[:size].add_(self._parts[:size])
        if reg is not None:
            self._sums[self._REG].add_(reg)

    def take(self) -> StepStats:
        """:meth:`result`, then :meth:`reset`: the sums since the last take."""
        stats = self.result()
        self.reset()
        return stats

    def reset(self) -> None:
        """Start again from zero (the same memory)."""
        if self._sums is not None:
            self._sums.zero_()
        self._host_counts = [0, 0]
        self.steps = 0

    def result(self) -> StepStats:
        """The sums so far (one read from the device)."""
        if self._sums is None:
            return StepStats()
        loss, v_lhs, v_rhs, count, counted, reg = self._sums.tolist()
        count, counted = int(count) + self._host_counts[0], int(counted) + self._host_counts[1]
        return StepStats(loss, reg, count, int(v_lhs), int(v_rhs), None if counted == count else counted)


@dataclass
class EvalResult:
    """Scores of an evaluation batch (for rank metrics) and its loss sum."""

    scores: Scores
    loss: float
    count: int


def batch_loss(model: EmbeddingModel, scores: Scores, batch: EdgeBatch) -> Tensor:
    """relation weight · (loss(lhs pos, lhs negs) + loss(rhs pos, rhs negs)), per-edge weighted
    (the sides scored together take one pass of the loss)."""
    weight = model.relation(batch.rel).weight
    groups = scores.groups
    loss = model.loss_fn(groups[0].pos, groups[0].neg_blocks, batch.weight)
    for group in groups[1:]:
        loss = loss + model.loss_fn(group.pos, group.neg_blocks, batch.weight)
    return loss * weight if weight != 1.0 else loss


def train_step(model: EmbeddingModel, lhs_table: EntityTable, rhs_table: EntityTable, batch: EdgeBatch,
               optimizer: ParameterOptimizer | None, *, generator: Draws = None,
               negatives: NegativeSampling | None = None, head: Head = training_head) -> StepStats:
    """Score the batch, backpropagate loss + reg, update the touched table rows (row Adagrad at
    ``spec.lr``) and the relation parameters (``optimizer``, see :func:`make_relation_optimizer`);
    the tables and global embeddings of ``spec.frozen`` types get no gradient and no update;
    return the batch's sums. ``head`` scores it (:class:`~pbgtrain.model.negative_scores.Head`).
    A training loop calls :func:`add_train_step` instead, which leaves them on the device."""
    totals = StepTotals()
    add_train_step(totals, model, lhs_table, rhs_table, batch, optimizer, generator=generator, negatives=negatives,
                   head=head)
    return totals.result()


def add_train_step(totals: StepTotals, model: EmbeddingModel, lhs_table: EntityTable, rhs_table: EntityTable,
                   batch: EdgeBatch, optimizer: ParameterOptimizer | None, *, generator: Draws = None,
                   negatives: NegativeSampling | None = None, head: Head = training_head) -> None:
    """:func:`train_step`, its sums added to ``totals`` without reading them back from the device."""
    if len(batch) == 0:
        return
    step_body(totals, model, lhs_table, rhs_table, batch, optimizer, generator=generator,
              negatives=negatives or model.spec.train_negatives, head=head, row_lr=model.spec.lr)
    totals.steps += 1


def step_body(totals: StepTotals, model: EmbeddingModel, lhs_table: EntityTable, rhs_table: EntityTable,
              batch: EdgeBatch, optimizer: ParameterOptimizer | None, *, generator: Draws, negatives: NegativeSampling,
              head: Head, row_lr: float | Tensor, relation_lr: Tensor | None = None) -> None:
    """One step's work on the device, the same eager or replayed: the gradients, row Adagrad at
    ``row_lr``, the relation parameters' update (``relation_lr``, a 0-dim tensor the run refills,
    replaces the optimizer's rate and leaves its step count to the caller: it needs a
    :class:`~pbgtrain.model.relation_adagrad.RelationAdagrad`), the sums added to ``totals``."""
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    step = training_gradients(model, lhs_table, rhs_table, batch, negatives, generator=generator, head=head)
    for gathered in step.gathered:
        gathered.apply_row_adagrad(row_lr)
    if optimizer is not None and relation_lr is None:
        optimizer.step()
    elif isinstance(optimizer, RelationAdagrad):
        optimizer.update(relation_lr)
    elif optimizer is not None:
        raise TypeError(f"a learning rate held on the device needs RelationAdagrad, found {type(optimizer).__name__}")
    totals.add(step.loss, step.reg, batch.count, step.violators, step.violators_counted_on)


@torch.no_grad()
def eval_step(model: EmbeddingModel, lhs_table: EntityTable, rhs_table: EntityTable, batch: EdgeBatch, *,
              generator: Draws = None, negatives: NegativeSampling | None = None) -> EvalResult:
    """Scores against the evaluation negatives (``eval_num_batch_negs``/``eval_num_uniform_negs``
    unless ``negatives`` is given), as the original evaluates held-out edges during training."""
    fwd = forward_batch(model, lhs_table, rhs_table, batch, negatives or model.spec.eval_negatives,
                        generator=generator, requires_grad=False)
    return EvalResult(fwd.scores, float(batch_loss(model, fwd.scores, batch).item()), len(batch))
