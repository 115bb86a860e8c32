"""Which negatives a batch takes (:class:`BatchNegatives`), uniform samples and the masks of ignored scores.

Positives are split in chunks of ``min(num_batch_negs, B)``. Each positive's batch negatives
are the other positives of its chunk on the corrupted side; its own slot and the padding of the
last chunk are masked to :data:`MASKED_SCORE`. Uniform negatives are drawn from the current
partition table. ``num_batch_negs = 0`` uses uniform negatives only (chunks of
``min(num_uniform_negs, B)``); a relation with ``all_negs`` scores every entity of the
partition, its positive masked.

>>> from pbgtrain.model.model import RelationSpec
>>> negs = batch_negatives(RelationSpec("r", "a", "a"), NegativeSampling(2, 3), num_pos=5)
>>> negs.lhs, negs.chunk_size, negs.num_chunks
(<NegativeMode.BATCH_UNIFORM: 'batch_uniform'>, 2, 3)
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from pbgtrain.model.counter_rng import CounterGenerator
from pbgtrain.model.model import NegativeSampling

Draws = torch.Generator | CounterGenerator | None
"""Where uniform negatives come from: a torch generator (None: torch's default one), or a
:class:`~pbgtrain.model.counter_rng.CounterGenerator`, whose state stays on the device (a replayed step)."""

MASKED_SCORE = -1e9


class NegativeMode(enum.Enum):
    NONE = "none"
    BATCH_UNIFORM = "batch_uniform"
    UNIFORM = "uniform"
    ALL = "all"


@dataclass(frozen=True)
class BatchNegatives:
    """Negatives of one batch: the mode of each side, the chunking and the uniform sample size."""

    lhs: NegativeMode
    rhs: NegativeMode
    chunk_size: int
    num_pos: int
    num_uniform: int
    share_uniform: bool

    @property
    def num_chunks(self) -> int:
        return -(-self.num_pos // self.chunk_size)

    def mode(self, side: str) -> NegativeMode:
        return self.lhs if side == "lhs" else self.rhs

    def num_uniform_samples(self, side: str) -> int:
        """How many uniform row ids to draw for ``side`` (0 when it uses none)."""
        if self.mode(side) not in (NegativeMode.BATCH_UNIFORM, NegativeMode.UNIFORM):
            return 0
        return self.num_uniform * (1 if self.share_uniform else self.num_chunks)


class _Relation(Protocol):
    """What the negatives read of a relation (:class:`~pbgtrain.model.model.RelationSpec`, or a config's)."""

    @property
    def all_negs(self) -> bool: ...


def batch_negatives(relation: _Relation, negatives: NegativeSampling, num_pos: int) -> BatchNegatives:
    """The negatives of a batch of ``num_pos`` edges of ``relation``: its chunks of
    ``min(num_batch_negs, num_pos)`` (``num_uniform_negs`` with uniform negatives only; the whole
    batch with every entity) and its uniform sample."""
    if relation.all_negs:
        mode, chunk = NegativeMode.ALL, num_pos
    elif negatives.num_batch_negs == 0:
        mode, chunk = NegativeMode.UNIFORM, min(negatives.num_uniform_negs, num_pos)
    else:
        mode, chunk = NegativeMode.BATCH_UNIFORM, min(negatives.num_batch_negs, num_pos)
    return BatchNegatives(
        lhs=NegativeMode.NONE if negatives.disable_lhs_negs else mode,
        rhs=NegativeMode.NONE if negatives.disable_rhs_negs else mode,
        chunk_size=max(chunk, 1),
        num_pos=num_pos,
        num_uniform=0 if mode is NegativeMode.ALL else negatives.num_uniform_negs,
        share_uniform=negatives.share_uniform_negs,
    )


def sample_uniform(num_entities: int, count: int, *, device: torch.device, generator: Draws = None) -> Tensor:
    """``count`` row offsets drawn uniformly (with replacement) from ``[0, num_entities)``."""
    if num_entities <= 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    if isinstance(generator, CounterGenerator):
        return generator.randint(num_entities, count)
    return torch.randint(num_entities, (count,), generator=generator, device=device)


def sample_uniform_many(draws: Sequence[tuple[int, int]], *, device: torch.device,
                        generator: Draws = None) -> list[Tensor]:
    """:func:`sample_uniform` for each ``(num_entities, count)`` of ``draws`` in turn (the same ids),
    drawn together where the generator can: a :class:`~pbgtrain.model.counter_rng.CounterGenerator`
    hashes them in one pass (a step's sides: the operations of one draw, not of one per side).

    >>> g = CounterGenerator(torch.device("cpu"))
    >>> g.manual_seed(3)
    >>> lhs, rhs = sample_uniform_many([(10, 4), (20, 4)], device=torch.device("cpu"), generator=g)
    >>> g.manual_seed(3)
    >>> [torch.equal(lhs, sample_uniform(10, 4, device=torch.device("cpu"), generator=g)),
    ...  torch.equal(rhs, sample_uniform(20, 4, device=torch.device("cpu"), generator=g))]
    [True, True]
    """
    if isinstance(generator, CounterGenerator):
        return generator.randints(draws)
    return [sample_uniform(n, count, device=device, generator=generator) for n, count in draws]
