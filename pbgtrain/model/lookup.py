"""The one place embeddings are looked up: deduplicated gather → autograd leaf → row updates.

:func:`gather_rows` takes every group of row offsets a step needs from one table, gathers each
distinct row once into a leaf tensor (applying ``max_norm`` in place, as the original's
embedding lookup does) and hands back per-group views that autograd tracks. After backward,
:meth:`GatheredRows.apply_row_adagrad` applies the summed gradient of each distinct row to the
table. A group may also be :class:`FeatureBags` (the entities of a featurized type): its
features are gathered like any rows and each bag's embedding is the mean of its features'
(``embedding_bag``, mode ``mean``, over the gathered leaf), so the gradient of a bag reaches
each of its features divided by the bag's size, and row Adagrad updates the feature rows.

A *frozen* table (an entity type kept fixed, ``pbgtrain fit --freeze``) is only read: its leaf
never requires a gradient, and ``max_norm`` clips the gathered copy (the same rows, scaled the
same way) instead of the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from pbgtrain.model.inputs import FeatureBags
from pbgtrain.model.tables import EntityTable


@dataclass
class GatheredRows:
    """Distinct rows ``ids`` of ``table`` gathered into ``leaf`` [len(ids), D]."""

    table: EntityTable
    ids: Tensor
    leaf: Tensor

    def apply_row_adagrad(self, lr: float) -> None:
        """Apply the leaf's gradient (if any) to the table with row-wise Adagrad."""
        if self.leaf.grad is not None:
            self.table.row_adagrad_(self.ids, self.leaf.grad, lr, consume_grad=True)
            self.leaf.grad = None


def gather_rows(table: EntityTable, groups: Sequence[Tensor | FeatureBags], *, max_norm: float | None,
                requires_grad: bool, frozen: bool = False) -> tuple[GatheredRows, list[Tensor]]:
    """Look up several groups of ``table``: row offsets, or feature bags of a featurized type.

    Returns the gathered rows and one embedding tensor per group ([len(group), D]; for bags,
    each bag's mean, zeros for an empty bag), differentiable into ``GatheredRows.leaf`` unless
    ``frozen`` (the table is never written: no gradient, ``max_norm`` applied to the copy).
    """
    ids_of = [g.data if isinstance(g, FeatureBags) else g.reshape(-1) for g in groups]
    sizes = [int(i.numel()) for i in ids_of]
    flat = torch.cat(ids_of) if ids_of else table.weights.new_zeros(0, dtype=torch.long)
    ids, inverse = torch.unique(flat, return_inverse=True)
    if max_norm is not None and not frozen:
        table.renorm_(ids, max_norm)
    leaf = table.weights.index_select(0, ids)
    if max_norm is not None and frozen:
        with torch.no_grad():
            torch.embedding_renorm_(leaf, torch.arange(len(ids), device=leaf.device), max_norm, 2.0)
    if requires_grad and not frozen:
        leaf.requires_grad_(True)
    parts = torch.split_with_sizes(inverse, sizes)
    plain = [k for k, g in enumerate(groups) if not isinstance(g, FeatureBags)]
    rows: list[Tensor] = [leaf] * len(groups)
    if plain:
        gathered: tuple[Tensor, ...] = _SplitGather.apply(leaf, *(parts[k] for k in plain))  # type: ignore[no-untyped-call]
        for k, r in zip(plain, gathered, strict=True):
            rows[k] = r
    for k, g in enumerate(groups):
        if isinstance(g, FeatureBags):
            rows[k] = bag_means(leaf, parts[k], g.offsets)
    return GatheredRows(table, ids, leaf), rows


def bag_means(rows: Tensor, index: Tensor, offsets: Tensor) -> Tensor:
    """Mean of ``rows[index[offsets[i]:offsets[i+1]]]`` for every bag ``i`` ([B, D]; zeros for empty bags)."""
    if len(offsets) == 1:
        return rows.new_zeros(0, rows.shape[1])
    return F.embedding_bag(index, rows, offsets[:-1], mode="mean")


class _SplitGather(torch.autograd.Function):
    """``leaf[index]`` for each index tensor; the backward adds every group's gradient straight
    into one [U, D] tensor (no concatenation of the groups' gradients)."""

    @staticmethod
    def forward(ctx: Any, leaf: Tensor, *indices: Tensor) -> tuple[Tensor, ...]:
        ctx.save_for_backward(*indices)
        ctx.leaf_shape = leaf.shape
        ctx.set_materialize_grads(False)
        return tuple(leaf.index_select(0, index) for index in indices)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        indices = ctx.saved_tensors
        out: Tensor | None = None
        for index, grad in zip(indices, grads, strict=True):
            if grad is None:
                continue
            if out is None:
                out = grad.new_zeros(ctx.leaf_shape)
            out.index_add_(0, index, grad)
        return (out, *(None for _ in indices))
