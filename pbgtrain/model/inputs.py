"""What the model consumes: a batch of edges of one bucket."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class EdgeBatch:
    """Edges as row offsets into the current partition tables.

    ``rel`` is the relation index (an int) in static mode and a LongTensor [B] of dynamic
    relation ids with ``dynamic_relations``; ``weight`` is an optional float tensor [B] of
    per-edge loss weights.
    """

    lhs: Tensor
    rhs: Tensor
    rel: int | Tensor
    weight: Tensor | None = None

    def __post_init__(self) -> None:
        n = self.lhs.shape[0]
        if self.lhs.dim() != 1 or self.rhs.shape != self.lhs.shape:
            raise ValueError(f"expected lhs and rhs of shape [B], found {tuple(self.lhs.shape)} "
                             f"and {tuple(self.rhs.shape)}")
        if isinstance(self.rel, Tensor) and self.rel.shape != (n,):
            raise ValueError(f"expected rel of shape [{n}], found {tuple(self.rel.shape)}")
        if self.weight is not None and self.weight.shape != (n,):
            raise ValueError(f"expected weight of shape [{n}], found {tuple(self.weight.shape)}")

    def __len__(self) -> int:
        return int(self.lhs.shape[0])
