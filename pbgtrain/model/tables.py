"""Embedding tables: one (entity type, partition)'s weights and its row-wise Adagrad state.

Row-wise Adagrad keeps one accumulator per row: for each distinct row with gradient ``g``
(duplicates summed first), ``G += mean(g²)`` and then ``w -= lr · g / sqrt(G + 1e-10)``.
The rows of a step may be given repeated, provided each row's summed gradient sits on one of
its occurrences and the others carry zeros (what :meth:`EntityTable.representatives` arranges,
without sorting the ids): the state and the weights are updated by ``index_add_``, so the zero
occurrences add nothing.

>>> t = EntityTable(torch.zeros(3, 2))
>>> t.row_adagrad_(torch.tensor([1]), torch.tensor([[3.0, 1.0]]), lr=0.5)
>>> t.adagrad_sum.tolist()
[0.0, 5.0, 0.0]
>>> [round(v, 4) for v in t.weights[1].tolist()]
[-0.6708, -0.2236]
"""

from __future__ import annotations

import torch
from torch import Tensor

from pbgtrain.model.scalars import constant

ADAGRAD_EPS = 1e-10


def row_adagrad_(weights: Tensor, state_sum: Tensor, ids: Tensor, grad: Tensor, lr: float | Tensor,
                 eps: float = ADAGRAD_EPS, *, consume_grad: bool = False) -> None:
    """One row-wise Adagrad step on rows ``ids`` with gradients ``grad`` [len(ids), D]; a row
    given more than once has its whole gradient on one occurrence and zeros on the others.
    ``consume_grad`` lets it overwrite ``grad`` instead of allocating a step tensor. ``lr`` may
    be a 0-dim tensor on the table's device (a replayed step reads it from memory)."""
    if ids.numel() == 0:
        return
    g2 = torch.linalg.vector_norm(grad, dim=1)
    g2 = g2.mul_(g2).div_(constant(grad.shape[1], g2))
    new_sum = state_sum.index_select(0, ids).add_(g2)
    state_sum.index_add_(0, ids, g2)
    rate = -lr if isinstance(lr, Tensor) else constant(-lr, new_sum)
    scale = new_sum.add_(constant(eps, new_sum)).rsqrt_().mul_(rate).unsqueeze(1)
    step = grad.mul_(scale) if consume_grad else grad * scale
    weights.index_add_(0, ids, step)


class EntityTable:
    """Float32 embeddings ``weights`` [N, D] of one (entity type, partition) and Adagrad sums [N].

    Both tensors live on the same device; everything computed from the table follows it.
    """

    def __init__(self, weights: Tensor, adagrad_sum: Tensor | None = None, *, entity_type: str = "",
                 partition: int = 0) -> None:
        if weights.dim() != 2:
            raise ValueError(f"expected weights [N, D], found shape {tuple(weights.shape)}")
        if adagrad_sum is None:
            adagrad_sum = weights.new_zeros(weights.shape[0])
        if adagrad_sum.shape != (weights.shape[0],):
            raise ValueError(f"expected adagrad_sum [{weights.shape[0]}], found {tuple(adagrad_sum.shape)}")
        if adagrad_sum.device != weights.device:
            raise ValueError(f"weights on {weights.device} but adagrad_sum on {adagrad_sum.device}")
        self.weights = weights
        self.adagrad_sum = adagrad_sum
        self.entity_type = entity_type
        self.partition = partition
        self._occurrence: Tensor | None = None  # row → one of its positions in the last ids given
        self._positions: dict[int, Tensor] = {}  # 0, 1, 2, … per length, on the map's device (kept: never freed,
        # since a step replayed as a CUDA graph reads the tensor it was captured with)

    def representatives(self, ids: Tensor) -> Tensor:
        """For each position of ``ids``, a position of the same row in ``ids``, the same for all
        of that row's occurrences: where their gradients are summed. No sort: each row remembers
        one of its positions in a map of the table's length (kept between steps).

        >>> EntityTable(torch.zeros(5, 2)).representatives(torch.tensor([3, 1, 3, 4, 1])).tolist()
        [2, 4, 2, 3, 4]
        """
        if self._occurrence is None or self._occurrence.device != ids.device:
            # positions within one step's ids: 4 bytes a row (int32) while the table trains
            self._occurrence = torch.empty(self.num_entities, dtype=torch.int32, device=ids.device)
            self._positions = {}
        positions = self._positions.get(len(ids))
        if positions is None:
            positions = self._positions[len(ids)] = torch.arange(len(ids), dtype=torch.int32, device=ids.device)
        self._occurrence.index_put_((ids,), positions)
        return self._occurrence.index_select(0, ids)

    @classmethod
    def random(cls, num_entities: int, dimension: int, *, init_scale: float = 1e-3,
               generator: torch.Generator | None = None, device: torch.device | str | None = None,
               entity_type: str = "", partition: int = 0) -> EntityTable:
        """A table initialised as the original: normal(0, 1) · init_scale, zero Adagrad sums."""
        weights = torch.randn(num_entities, dimension, generator=generator, device=device).mul_(init_scale)
        return cls(weights, entity_type=entity_type, partition=partition)

    @property
    def num_entities(self) -> int:
        return int(self.weights.shape[0])

    @property
    def dimension(self) -> int:
        return int(self.weights.shape[1])

    @property
    def device(self) -> torch.device:
        return self.weights.device

    @property
    def nbytes(self) -> int:
        """Bytes of the weights and the Adagrad sums."""
        return self.weights.numel() * self.weights.element_size() + \
            self.adagrad_sum.numel() * self.adagrad_sum.element_size()

    def gather(self, ids: Tensor) -> Tensor:
        """Rows ``ids`` of the weights, in order (the one read of rows a step makes:
        :func:`pbgtrain.model.lookup.gather_rows`)."""
        return self.weights.index_select(0, ids)

    @torch.no_grad()
    def renorm_(self, ids: Tensor, max_norm: float) -> None:
        """Scale rows ``ids`` whose L2 norm exceeds ``max_norm`` back to it (as embedding max_norm)."""
        torch.embedding_renorm_(self.weights, ids, max_norm, 2.0)

    @torch.no_grad()
    def row_adagrad_(self, ids: Tensor, grad: Tensor, lr: float | Tensor, *, consume_grad: bool = False) -> None:
        """Row-wise Adagrad on distinct rows ``ids``."""
        row_adagrad_(self.weights, self.adagrad_sum, ids, grad, lr, consume_grad=consume_grad)

    def __repr__(self) -> str:
        return (f"EntityTable(type={self.entity_type!r}, partition={self.partition}, "
                f"shape={tuple(self.weights.shape)}, device={self.device})")
