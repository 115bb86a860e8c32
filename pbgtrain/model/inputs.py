"""What the model consumes: a batch of edges of one bucket, with feature bags for featurized sides.

>>> bags = FeatureBags(torch.tensor([0, 2, 2, 5]), torch.tensor([7, 8, 1, 2, 3]))
>>> len(bags), bags.take(torch.tensor([2, 0])).to_lists()
(3, [[1, 2, 3], [7, 8]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pbgio.spec.edges import Side

if TYPE_CHECKING:
    from pbgio.edges import EdgeBucket, FeatureLists


@dataclass(frozen=True)
class FeatureBags:
    """Bags of feature ids (rows of a featurized type's table): bag ``i`` is
    ``data[offsets[i]:offsets[i+1]]``; ``offsets`` has one entry more than there are bags."""

    offsets: Tensor
    data: Tensor

    def __post_init__(self) -> None:
        if self.offsets.dim() != 1 or self.offsets.shape[0] < 1 or self.data.dim() != 1:
            raise ValueError(f"expected offsets [B + 1] and data [nnz], found {tuple(self.offsets.shape)} "
                             f"and {tuple(self.data.shape)}")

    @classmethod
    def from_lists(cls, lists: FeatureLists, device: torch.device | str | None = None) -> FeatureBags:
        """The bags of a pbgio :class:`~pbgio.edges.FeatureLists` (offsets rebased to 0)."""
        offsets = torch.from_numpy(lists.offsets - lists.offsets[0]).to(device)
        return cls(offsets, torch.from_numpy(lists.data).to(device))

    @classmethod
    def of(cls, bags: list[list[int]], device: torch.device | str | None = None) -> FeatureBags:
        """Bags from Python lists of feature ids."""
        from pbgio.edges import FeatureLists

        return cls.from_lists(FeatureLists.from_lists(bags), device)

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def lengths(self) -> Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def take(self, idx: Tensor) -> FeatureBags:
        """The bags ``idx`` (in that order), as a new compact set of bags."""
        starts = self.offsets[idx]
        lengths = self.offsets[idx + 1] - starts
        offsets = torch.zeros(len(idx) + 1, dtype=torch.long, device=self.offsets.device)
        torch.cumsum(lengths, 0, out=offsets[1:])
        total = int(offsets[-1])
        shift = torch.repeat_interleave(starts - offsets[:-1], lengths, output_size=total)
        positions = torch.arange(total, device=self.offsets.device) + shift
        return FeatureBags(offsets, self.data[positions])

    def with_empty(self, count: int) -> FeatureBags:
        """These bags and ``count`` empty ones after them."""
        return FeatureBags(torch.cat((self.offsets, self.offsets[-1:].expand(count))), self.data)

    def to(self, device: torch.device | str) -> FeatureBags:
        return FeatureBags(self.offsets.to(device), self.data.to(device))

    def to_lists(self) -> list[list[int]]:
        bounds = self.offsets.tolist()
        values = self.data.tolist()
        return [values[bounds[i]:bounds[i + 1]] for i in range(len(self))]


@dataclass(frozen=True)
class EdgeBatch:
    """Edges as row offsets into the current partition tables.

    ``rel`` is the relation index (an int) in static mode and a LongTensor [B] of dynamic
    relation ids with ``dynamic_relations``; ``weight`` is an optional float tensor [B] of
    per-edge loss weights. A side whose entity type is featurized carries its entities as
    ``lhs_bags``/``rhs_bags`` (its ``lhs``/``rhs`` offsets are then ignored, as in the format).
    ``num_real`` (a 0-dim int64 tensor on the batch's device) marks the rows from there on as padding
    (see :meth:`pad`): a count held as data, so that a step captured once serves every batch.
    """

    lhs: Tensor
    rhs: Tensor
    rel: int | Tensor
    weight: Tensor | None = None
    lhs_bags: FeatureBags | None = None
    rhs_bags: FeatureBags | None = None
    num_real: Tensor | None = None

    def __post_init__(self) -> None:
        n = self.lhs.shape[0]
        if self.lhs.dim() != 1 or self.rhs.shape != self.lhs.shape:
            raise ValueError(f"expected lhs and rhs of shape [B], found {tuple(self.lhs.shape)} "
                             f"and {tuple(self.rhs.shape)}")
        if isinstance(self.rel, Tensor) and self.rel.shape != (n,):
            raise ValueError(f"expected rel of shape [{n}], found {tuple(self.rel.shape)}")
        if self.weight is not None and self.weight.shape != (n,):
            raise ValueError(f"expected weight of shape [{n}], found {tuple(self.weight.shape)}")
        for side, bags in (("lhs", self.lhs_bags), ("rhs", self.rhs_bags)):
            if bags is not None and len(bags) != n:
                raise ValueError(f"expected {n} {side} feature bags, found {len(bags)}")

    def __len__(self) -> int:
        return int(self.lhs.shape[0])

    @property
    def count(self) -> Tensor | int:
        """How many of the rows are edges (the rest is padding): on the device when padded."""
        return len(self) if self.num_real is None else self.num_real

    def live_rows(self) -> Tensor | None:
        """[B]: 1.0 for an edge, 0.0 for a padding row (None: the batch has no padding)."""
        if self.num_real is None:
            return None
        return (torch.arange(len(self), device=self.lhs.device) < self.num_real).float()

    def pad(self, size: int) -> EdgeBatch:
        """This batch with padding rows appended up to ``size`` (a static shape: every batch of a
        run the same size). A padding row is entity 0 on both sides (relation 0 with dynamic
        relations, an empty bag on a featurized side) with weight 0; the step masks it wherever
        it would count: as a batch negative of the real edges, in N3, in the violators and the
        edge count. The padded step equals the step on the real edges with shared uniform
        negatives and the softmax or ranking loss (the logistic loss counts masked negatives in
        its 1/K, and per-chunk uniform negatives are drawn per chunk of the padded batch).

        >>> b = EdgeBatch(torch.tensor([3, 4]), torch.tensor([5, 6]), 1).pad(4)
        >>> b.lhs.tolist(), b.weight.tolist(), int(b.count)
        ([3, 4, 0, 0], [1.0, 1.0, 0.0, 0.0], 2)
        """
        extra = size - len(self)
        if extra < 0:
            raise ValueError(f"cannot pad a batch of {len(self)} edges to {size}")
        if extra == 0 and self.num_real is None:
            return self
        count = torch.tensor(len(self), device=self.lhs.device) if self.num_real is None else self.num_real

        def ids(x: Tensor) -> Tensor:
            return torch.cat((x, x.new_zeros(extra)))

        weight = torch.ones(len(self), device=self.lhs.device) if self.weight is None else self.weight
        return EdgeBatch(ids(self.lhs), ids(self.rhs), ids(self.rel) if isinstance(self.rel, Tensor) else self.rel,
                         torch.cat((weight, weight.new_zeros(extra))),
                         None if self.lhs_bags is None else self.lhs_bags.with_empty(extra),
                         None if self.rhs_bags is None else self.rhs_bags.with_empty(extra), count)

    def bags(self, side: str) -> FeatureBags | None:
        return self.lhs_bags if side == "lhs" else self.rhs_bags

    def entities(self, side: str) -> Tensor | FeatureBags:
        """Row offsets of ``side``, or its feature bags when that side is featurized."""
        bags = self.bags(side)
        if bags is not None:
            return bags
        return self.lhs if side == "lhs" else self.rhs


@dataclass(frozen=True)
class BucketEdges:
    """The edges of one bucket (chunk) on the training device, ready to be cut into batches."""

    lhs: Tensor
    rhs: Tensor
    rel: Tensor
    weight: Tensor | None
    lhs_bags: FeatureBags | None
    rhs_bags: FeatureBags | None
    source: str = ""

    @classmethod
    def from_bucket(cls, edges: EdgeBucket, device: torch.device | str, source: str = "") -> BucketEdges:
        """Move a pbgio :class:`~pbgio.edges.EdgeBucket` to ``device`` (``source`` names its file in errors)."""
        def bags(lists: FeatureLists | None) -> FeatureBags | None:
            return None if lists is None else FeatureBags.from_lists(lists, device)

        return cls(torch.from_numpy(edges.lhs).to(device), torch.from_numpy(edges.rhs).to(device),
                   torch.from_numpy(edges.rel).to(device),
                   None if edges.weight is None else torch.from_numpy(edges.weight).to(device),
                   bags(edges.lhs_features), bags(edges.rhs_features), source)

    def __len__(self) -> int:
        return int(self.rel.shape[0])

    def batch(self, idx: Tensor, rel: int | Tensor, lhs_featurized: bool = False,
              rhs_featurized: bool = False) -> EdgeBatch:
        """Edges ``idx`` as a batch of relation ``rel``; a featurized side takes its bags."""
        bags: dict[str, FeatureBags | None] = {"lhs": None, "rhs": None}
        sides: tuple[tuple[Side, bool, Any], ...] = (("lhs", lhs_featurized, self.lhs_bags),
                                                     ("rhs", rhs_featurized, self.rhs_bags))
        for side, featurized, source in sides:
            if not featurized:
                continue
            if source is None:
                import numpy as np
                from numpy.typing import NDArray

                from pbgio.checks.edges import featurized_missing
                from pbgio.errors import FormatError

                every_row: NDArray[np.bool_] = np.ones(1, dtype=np.bool_)  # the batch's rows all need bags
                missing = featurized_missing(side, every_row)
                if missing is None:  # cannot happen: every row of the batch needs the datasets
                    raise RuntimeError(f"featurized_missing found no problem for the {side} side")
                raise FormatError(missing.issue(self.source or None, missing.describe(0)))
            bags[side] = source.take(idx)
        return EdgeBatch(self.lhs[idx], self.rhs[idx], rel, None if self.weight is None else self.weight[idx],
                         bags["lhs"], bags["rhs"])
