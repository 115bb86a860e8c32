"""Negative scores of one side, or of both sides at once, as one autograd node.

The sides of a batch are scored together when their negatives have the same shape (the usual
case: both sides take batch + uniform negatives, or both score every entity): their queries,
positives and candidates are stacked on a leading axis of size 2, so that each kind of block is
one batched matrix product, the loss one pass and the count of violators one reduction. A side
scored alone has a leading axis of size 1.

The blocks, for S sides of B positives, chunks of ``chunk`` (the last padded with zero rows):

- batch negatives [S, B, chunk]: each positive against the positives of its chunk, its own
  score and the padding columns set to :data:`~pbgtrain.model.negatives.MASKED_SCORE`;
- uniform negatives [S, B, U]: against U candidates shared by the batch, or against each
  chunk's own U (``share_uniform_negs`` false);
- every entity [S, B, N] (``all_negs``): the positive's own entity masked.

The backward applies the comparator's adjoint (:meth:`~pbgtrain.model.comparators.Comparator.all_pairs_grad`)
to the blocks' gradients, which are zeroed at the masked scores first: a masked score is a
constant.

>>> from pbgtrain.model.comparators import make_comparator
>>> from pbgtrain.model.negatives import NegativeMode
>>> q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
>>> shape = BlockShape(NegativeMode.BATCH_UNIFORM, chunk=2, num_pos=3, uniform="none")
>>> (batch,) = negative_blocks(make_comparator("dot"), shape, [q], [q], [], masked=-9.0)
>>> batch[0].tolist()
[[-9.0, 0.0], [0.0, -9.0], [-9.0, -9.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from pbgtrain.model.comparators import Comparator
from pbgtrain.model.negatives import NegativeMode
from pbgtrain.model.precision import autocast_state, full_precision

UniformLayout = Literal["none", "shared", "per_chunk", "all"]


@dataclass(frozen=True)
class BlockShape:
    """The layout of the blocks: the mode, the chunking, and how the candidates are given
    (``none``; ``shared``: [U, D] per side; ``per_chunk``: [chunks · U, D] per side; ``all``:
    every entity, [N, D] per side, or one tensor for both sides)."""

    mode: NegativeMode
    chunk: int
    num_pos: int
    uniform: UniformLayout
    num_real: int | None = None  # positives past it are padding: masked as batch negatives

    @property
    def num_chunks(self) -> int:
        return -(-self.num_pos // self.chunk)

    @property
    def padded(self) -> int:
        return self.num_chunks * self.chunk

    def mask_columns(self, scores: Tensor, value: float) -> None:
        """Set the batch-negative columns [S·chunks, chunk, chunk] that are no positive (past
        ``num_real``, or past the batch in the last chunk) to ``value``."""
        real = self.num_pos if self.num_real is None else self.num_real
        if self.padded == real:
            return
        chunked = scores.view(-1, self.num_chunks, self.chunk, self.chunk)
        first, offset = divmod(real, self.chunk)
        chunked[:, first, :, offset:] = value
        if first + 1 < self.num_chunks:
            chunked[:, first + 1:] = value


def _stack(parts: Sequence[Tensor]) -> Tensor:
    return parts[0].unsqueeze(0) if len(parts) == 1 else torch.stack(tuple(parts))


def _pad(x: Tensor, rows: int) -> Tensor:
    """[S, B, …] with zero rows appended on axis 1 up to ``rows``."""
    if x.shape[1] == rows:
        return x
    return torch.cat((x, x.new_zeros(x.shape[0], rows - x.shape[1], *x.shape[2:])), dim=1)


class _NegativeBlocks(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, cmp: Comparator, shape: BlockShape, masked: float, own: Tensor | None, num_sides: int,
                num_candidates: int, *tensors: Tensor) -> tuple[Tensor, ...]:
        queries = tensors[:num_sides]
        positives = tensors[num_sides:2 * num_sides] if shape.mode is NegativeMode.BATCH_UNIFORM else ()
        candidates = tensors[len(tensors) - num_candidates:]
        q = _stack(queries)
        sides, num_pos, dim = q.shape
        chunk, chunks, padded = shape.chunk, shape.num_chunks, shape.padded
        ctx.cmp, ctx.shape, ctx.num_sides, ctx.autocast = cmp, shape, num_sides, autocast_state(q)
        ctx.has_positives, ctx.num_candidates = bool(positives), num_candidates
        saved: list[Tensor] = [q]
        blocks: list[Tensor] = []
        if positives:
            qc = _pad(q, padded).view(sides * chunks, chunk, dim)
            pc = _pad(_stack(positives), padded).view(sides * chunks, chunk, dim)
            scores = full_precision(cmp.all_pairs(qc, pc))
            scores.diagonal(dim1=1, dim2=2).fill_(masked)
            shape.mask_columns(scores, masked)
            saved += [qc, pc, scores]
            blocks.append(scores.view(sides, padded, chunk)[:, :num_pos])
        if candidates:
            if shape.uniform == "per_chunk":
                qc = _pad(q, padded).view(sides * chunks, chunk, dim)
                c = _stack(candidates).view(sides * chunks, -1, dim)
                scores = full_precision(cmp.all_pairs(qc, c))
                saved += [qc, c, scores]
                blocks.append(scores.view(sides, padded, -1)[:, :num_pos])
            else:
                c = candidates[0].unsqueeze(0) if num_candidates == 1 else _stack(candidates)
                scores = full_precision(cmp.all_pairs(q, c))
                if own is not None:
                    scores.scatter_(2, own.unsqueeze(2), masked)
                saved += [q, c, scores]
                blocks.append(scores)
        ctx.own = own
        ctx.save_for_backward(*saved)
        return tuple(blocks)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        shape: BlockShape = ctx.shape
        cmp: Comparator = ctx.cmp
        saved = ctx.saved_tensors
        q = saved[0]
        sides, num_pos, dim = q.shape
        chunk, chunks, padded = shape.chunk, shape.num_chunks, shape.padded
        dq = torch.zeros_like(q)
        dp: Tensor | None = None
        dc: Tensor | None = None
        k, rest = 0, list(saved[1:])
        device_type = q.device.type
        with torch.autocast(device_type, dtype=ctx.autocast or torch.bfloat16, enabled=ctx.autocast is not None):
            if ctx.has_positives:
                qc, pc, scores = rest[0:3]
                rest = rest[3:]
                g = grads[k]
                k += 1
                if g is not None:
                    full = g.new_zeros(sides, padded, chunk)
                    full[:, :num_pos] = g
                    full = full.view(sides * chunks, chunk, chunk)
                    full.diagonal(dim1=1, dim2=2).zero_()  # the masked scores are constants
                    shape.mask_columns(full, 0.0)
                    dqc, dpc = cmp.all_pairs_grad(qc, pc, scores, full)
                    dq += full_precision(dqc).view(sides, padded, dim)[:, :num_pos]
                    dp = full_precision(dpc).view(sides, padded, dim)[:, :num_pos]
            if ctx.num_candidates:
                qx, c, scores = rest[0:3]
                g = grads[k]
                if g is not None:
                    if shape.uniform == "per_chunk":
                        full = g.new_zeros(sides, padded, g.shape[2])
                        full[:, :num_pos] = g
                        dqc, dcc = cmp.all_pairs_grad(qx, c, scores, full.view(sides * chunks, chunk, -1))
                        dq += full_precision(dqc).view(sides, padded, dim)[:, :num_pos]
                        dc = full_precision(dcc).view(sides, -1, dim)
                    else:
                        if ctx.own is not None:
                            g = g.scatter(2, ctx.own.unsqueeze(2), 0.0)
                        dqx, dcx = cmp.all_pairs_grad(qx, c, scores, g)
                        dq += full_precision(dqx)
                        dc = full_precision(dcx)
                        if ctx.num_candidates == 1 and sides > 1:
                            dc = dc.sum(0, keepdim=True)
        num_sides = ctx.num_sides
        out: list[Tensor | None] = [None] * 6 + list(dq.unbind(0)) if num_sides > 1 else [None] * 6 + [dq[0]]
        if ctx.has_positives:
            out += list(dp.unbind(0)) if dp is not None else [None] * num_sides
        if ctx.num_candidates:
            out += list(dc.unbind(0)) if dc is not None else [None] * ctx.num_candidates
        return tuple(out)


def negative_blocks(cmp: Comparator, shape: BlockShape, queries: Sequence[Tensor], positives: Sequence[Tensor],
                    candidates: Sequence[Tensor], *, masked: float, own: Tensor | None = None) -> tuple[Tensor, ...]:
    """The negative score blocks [S, B, K_i] of S sides (1 or 2) scored together.

    ``queries`` [B, D] per side: the other side of each edge, prepared; ``positives`` [B, D] per
    side (batch negatives; empty unless the mode takes them); ``candidates``: per side (or one
    for both sides when the same tensor serves both, ``all`` only), laid out as ``shape.uniform``
    says; ``own`` [S, B]: each positive's own entity (``all`` only).
    """
    if shape.uniform == "none":
        candidates = ()
    out: tuple[Tensor, ...] = _NegativeBlocks.apply(  # type: ignore[no-untyped-call]
        cmp, shape, masked, own, len(queries), len(candidates), *queries, *positives, *candidates)
    return out
