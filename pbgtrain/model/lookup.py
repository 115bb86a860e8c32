"""The one place embeddings are looked up: gather → autograd leaf → row updates, with no sort.

:func:`gather_rows` takes every group of row offsets a step needs from one table, gathers them
in one ``index_select`` into a leaf tensor (one row per occurrence, groups in order; applying
``max_norm`` to the table first, as the original's embedding lookup does) and hands back one
view per group that autograd tracks. A row looked up several times is gathered several times;
:meth:`GatheredRows.apply_row_adagrad` sums the gradients of a row's occurrences onto one of them
(``index_add_`` through the table's occurrence map, :meth:`EntityTable.representatives`, instead
of a sort of the ids) and applies row-wise Adagrad once per distinct row. A group may also be
:class:`FeatureBags` (the entities of a featurized type): its features are gathered like any
rows and each bag's embedding is the mean of its features' (``embedding_bag``, mode ``mean``), so
the gradient of a bag reaches each of its features divided by the bag's size, and row Adagrad
updates the feature rows.

A *frozen* table (an entity type kept fixed, ``pbgtrain fit --freeze``) is only read: its leaf
never requires a gradient, and ``max_norm`` clips the gathered copy (the same rows, scaled the
same way) instead of the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from pbgtrain.model.inputs import FeatureBags
from pbgtrain.model.tables import EntityTable


@dataclass
class GatheredRows:
    """Rows ``ids`` of ``table`` (one per occurrence, possibly repeated) gathered into ``leaf``
    [len(ids), D]; ``representative[i]`` is the occurrence that carries row ``ids[i]``'s summed
    gradient (the same for every occurrence of a row; None when the leaf takes no gradient)."""

    table: EntityTable
    ids: Tensor
    leaf: Tensor
    representative: Tensor | None = None
    groups: Sequence[Tensor | FeatureBags] = ()  # what was looked up, in the leaf's order
    sizes: Sequence[int] = ()  # the leaf's rows per group

    def set_grad(self, group_grads: Sequence[Tensor | None]) -> None:
        """Set the leaf's gradient from each group's ([len(group), D]; None: zeros), as autograd
        would have accumulated it through :func:`gather_rows`'s views and bag means."""
        pieces = []
        for group, size, grad in zip(self.groups, self.sizes, group_grads, strict=True):
            if grad is None:
                pieces.append(self.leaf.new_zeros(size, self.leaf.shape[1]))
            elif isinstance(group, FeatureBags):
                pieces.append(bag_means_grad(group.offsets, size, grad))
            else:
                pieces.append(grad)
        self.leaf.grad = pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def apply_row_adagrad(self, lr: float | Tensor) -> None:
        """Apply the leaf's gradient (if any) to the table with row-wise Adagrad."""
        grad = self.leaf.grad
        if grad is None or self.representative is None:
            return
        summed = torch.zeros_like(grad).index_add_(0, self.representative, grad)
        self.table.row_adagrad_(self.ids, summed, lr, consume_grad=True)
        self.leaf.grad = None


def gather_rows(table: EntityTable, groups: Sequence[Tensor | FeatureBags], *, max_norm: float | None,
                requires_grad: bool, frozen: bool = False,
                updates: bool | None = None) -> tuple[GatheredRows, list[Tensor]]:
    """Look up several groups of ``table``: row offsets, or feature bags of a featurized type.

    Returns the gathered rows and one embedding tensor per group ([len(group), D]; for bags,
    each bag's mean, zeros for an empty bag), differentiable into ``GatheredRows.leaf`` when
    ``requires_grad`` unless ``frozen`` (the table is never written: no gradient, ``max_norm``
    applied to the copy). ``updates`` (default: ``requires_grad``): the rows will be updated
    from a gradient that the leaf is given (:meth:`GatheredRows.set_grad`, or autograd).
    """
    ids_of = [g.data if isinstance(g, FeatureBags) else g if g.dim() == 1 else g.reshape(-1) for g in groups]
    sizes = [int(i.numel()) for i in ids_of]
    flat = ids_of[0] if len(ids_of) == 1 else torch.cat(ids_of) if ids_of else \
        table.weights.new_zeros(0, dtype=torch.long)
    if max_norm is not None and not frozen:
        table.renorm_(flat, max_norm)
    leaf = table.gather(flat)
    if max_norm is not None and frozen:
        with torch.no_grad():
            torch.embedding_renorm_(leaf, torch.arange(len(flat), device=leaf.device), max_norm, 2.0)
    if requires_grad and not frozen:
        leaf.requires_grad_(True)
    trains = (requires_grad if updates is None else updates) and not frozen
    parts = list(torch.split_with_sizes(leaf, sizes)) if len(groups) > 1 else [leaf]
    rows = [bag_means(part, torch.arange(len(part), device=part.device), g.offsets)
            if isinstance(g, FeatureBags) else part for g, part in zip(groups, parts, strict=True)]
    return GatheredRows(table, flat, leaf, table.representatives(flat) if trains else None, groups, sizes), rows


def bag_means_grad(offsets: Tensor, num_rows: int, grad: Tensor) -> Tensor:
    """The gradient of the feature rows [num_rows, D] of :func:`bag_means` (rows in bag order)
    from ``grad`` [B, D]: each row gets its bag's gradient over the bag's size."""
    sizes = offsets.diff()
    bag_of = torch.repeat_interleave(torch.arange(len(sizes), device=grad.device), sizes, output_size=num_rows)
    return grad.index_select(0, bag_of) / sizes.clamp_min(1).index_select(0, bag_of).unsqueeze(1).to(grad.dtype)


def bag_means(rows: Tensor, index: Tensor, offsets: Tensor) -> Tensor:
    """Mean of ``rows[index[offsets[i]:offsets[i+1]]]`` for every bag ``i`` ([B, D]; zeros for empty bags)."""
    if len(offsets) == 1:
        return rows.new_zeros(0, rows.shape[1])
    return F.embedding_bag(index, rows, offsets[:-1], mode="mean")
