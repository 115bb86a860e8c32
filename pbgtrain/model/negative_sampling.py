"""Which negatives a batch takes (:class:`BatchNegatives`), uniform samples and the masks of ignored scores.

Positives are split in chunks of ``min(num_batch_negs, B)``. Each positive's batch negatives
are the other positives of its chunk on the corrupted side; its own slot and the padding of the
last chunk are masked to :data:`MASKED_SCORE`. Uniform negatives are drawn from the current
partition table. ``num_batch_negs = 0`` uses uniform negatives only (chunks of
``min(num_uniform_negs, B)``); a relation with ``all_negs`` scores every entity of the
partition, its positive masked.

>>> negs = batch_negatives(RelationSpec("r", "a", "a"), NegativeSampling(2, 3), num_pos=5)
>>> negs.lhs, negs.chunk_size, negs.num_chunks
(<NegativeMode.BATCH_UNIFORM: 'batch_uniform'>, 2, 3)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import Tensor

from pbgtrain.model.counter_rng import CounterGenerator
from pbgtrain.model.model import NegativeSampling, RelationSpec

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


def batch_negatives(relation: RelationSpec, negatives: NegativeSampling, num_pos: int) -> BatchNegatives:
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
