"""Which training step a run takes, decided once before it starts (:class:`StepChoice`).

Two heads score a batch (:class:`~pbgtrain.model.negative_scores.Head`): the score matrices
written out (every loss and comparator) and the softmax loss as attention
(:mod:`pbgtrain.model.attention`: the softmax loss with a dot product of prepared vectors, dot or
cos). A step is run eagerly or replayed (:mod:`pbgtrain.model.runner`): captured once per batch
shape as a CUDA graph on a GPU, or, on a CPU, through the same driver with a stand-in that calls
the step's body. What can be replayed is what has no host synchronisation inside the step and a
fixed shape from batch to batch; :func:`capture_problem` says what cannot.

>>> from types import SimpleNamespace
>>> cfg = SimpleNamespace(loss_fn="ranking", comparator="dot", bias=False, max_norm=None, dynamic_relations=False,
...                       relations=[SimpleNamespace(operator="none")], num_machines=1, featurized_types=lambda: [])
>>> print(attention_problem(cfg))
the attention form is the softmax loss's; this run's loss_fn is ranking
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from pbgtrain.model.attention import VIOLATOR_ROWS
from pbgtrain.model.model import NegativeSampling
from pbgtrain.model.negative_sampling import BatchNegatives, NegativeMode, batch_negatives

Head = Literal["scores", "attention"]
Capture = Literal["none", "cuda-graph", "stand-in"]


class _Relation(Protocol):
    @property
    def operator(self) -> str: ...

    @property
    def all_negs(self) -> bool: ...


class StepConfig(Protocol):
    """What the choice reads of a run's config (:class:`pbgio.config.ConfigSchema` has it)."""

    @property
    def loss_fn(self) -> str: ...

    @property
    def comparator(self) -> str: ...

    @property
    def bias(self) -> bool: ...

    @property
    def max_norm(self) -> float | None: ...

    @property
    def dynamic_relations(self) -> bool: ...

    @property
    def num_machines(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def num_batch_negs(self) -> int: ...

    @property
    def num_uniform_negs(self) -> int: ...

    @property
    def relations(self) -> Iterable[_Relation]: ...

    def featurized_types(self) -> Iterable[str]: ...


@dataclass(frozen=True)
class StepChoice:
    """The step of a run: its head, the score-matrix head's elementwise passes compiled or not,
    and how it is replayed; ``note`` is the run's line that says so (and why, when the faster
    step cannot run this config)."""

    head: Head = "scores"
    compiled: bool = False
    capture: Capture = "none"
    note: str = ""

    def describe(self) -> str:
        """The step in words.

        >>> StepChoice("attention", capture="cuda-graph").describe()
        'softmax over negatives as attention, replayed as a CUDA graph per batch shape'
        """
        head = "softmax over negatives as attention" if self.head == "attention" else \
            "score matrices" + (" (elementwise passes compiled)" if self.compiled else "")
        replay = {"none": "", "cuda-graph": ", replayed as a CUDA graph per batch shape",
                  "stand-in": ", through the replay driver (on a CPU it calls the step's body)"}[self.capture]
        return head + replay


def attention_problem(config: StepConfig) -> str | None:
    """Why the attention form cannot train ``config`` (None when it can)."""
    if config.loss_fn != "softmax":
        return f"the attention form is the softmax loss's; this run's loss_fn is {config.loss_fn}"
    if config.comparator not in ("dot", "cos"):
        return f"the attention form scores by a dot product (dot, or cos on normalised rows); this run's comparator " \
               f"is {config.comparator}"
    if config.bias:
        return "the attention form scores by a dot product; this run's comparator has a bias (bias: true)"
    featurized = sorted(config.featurized_types())
    if featurized:
        return f"featurized entity types ({', '.join(featurized)}) are scored against their chunk's bags only"
    return None


def capture_problem(config: StepConfig) -> str | None:
    """Why a step of ``config`` cannot be replayed (None when it can): something in it makes the
    host wait for the device, or a shape that changes from batch to batch."""
    if config.num_machines > 1:
        return "several trainers update the shared parameters while they train (num_machines > 1)"
    featurized = sorted(config.featurized_types())
    if featurized:
        return f"the feature bags of {', '.join(featurized)} change length from batch to batch"
    operators = {r.operator for r in config.relations}
    if config.dynamic_relations and operators & {"linear", "affine"}:
        return "the dynamic linear and affine operators group a batch's edges by relation on the host"
    if config.max_norm is not None:
        return "max_norm renormalises rows through a sort whose length the host reads"
    return None


CPU_ATTENTION_KEYS = 1000
"""On a CPU the attention form is the faster where each edge's softmax runs over at least this many
candidates in one group (a chunk with its uniform negatives, or every entity): measured side by
side on a 2-core Xeon with AMX (docs/guides/gpu.md), 1.12–1.5× there and 0.7–0.9× on smaller
groups, or where same-chunk and shared uniform negatives make two groups."""


def keys_per_edge(config: StepConfig, largest_partition: int) -> int:
    """The fewest candidates an edge of ``config`` is scored against in one group of keys (0 where
    its negatives come as two groups: same-chunk ones, and uniform ones shared by the batch and
    more than a chunk). ``largest_partition``: the most entities of a partition (every-entity
    negatives).

    >>> from types import SimpleNamespace
    >>> lj = SimpleNamespace(relations=[SimpleNamespace(all_negs=False)], batch_size=10_000, num_batch_negs=1000,
    ...                      num_uniform_negs=1000)
    >>> keys_per_edge(lj, 4_800_000), keys_per_edge(SimpleNamespace(**{**vars(lj), "num_uniform_negs": 1001}), 1)
    (2000, 0)
    """
    sampling = NegativeSampling(config.num_batch_negs, config.num_uniform_negs)
    return min((_keys(batch_negatives(r, sampling, config.batch_size), largest_partition) for r in config.relations),
               default=0)


def _keys(negatives: BatchNegatives, largest_partition: int) -> int:
    """The candidates of one group of keys of a batch's ``negatives`` (0: two groups)."""
    if negatives.lhs is NegativeMode.ALL:
        return largest_partition
    if negatives.lhs is NegativeMode.UNIFORM:
        return negatives.num_uniform
    chunk, uniform = negatives.chunk_size, negatives.num_uniform
    return chunk + uniform if uniform <= chunk else 0


SAMPLED_VIOLATORS = f"violators counted on the first {VIOLATOR_ROWS} edges of each batch"
"""What the attention form's stats say of their violators."""
