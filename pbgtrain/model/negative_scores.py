"""Negative scores of one side, or of both sides at once: for evaluation (one autograd node) and
for training (:func:`training_head`: the loss and its gradients, by hand).

The sides of a batch are scored together when their negatives have the same shape (the usual
case: both sides take batch + uniform negatives, or both score every entity): their queries,
positives and candidates are stacked on a leading axis of size 2, so that each kind of block is
one batched matrix product, the loss one pass and the count of violators one reduction. A side
scored alone has a leading axis of size 1.

The blocks, for S sides of B positives, chunks of ``chunk`` (the last padded with zero rows):

- batch negatives [S, B, chunk]: each positive against the positives of its chunk, its own
  score and the padding columns set to :data:`~pbgtrain.model.negative_sampling.MASKED_SCORE`;
- uniform negatives [S, B, U]: against U candidates shared by the batch, or against each
  chunk's own U (``share_uniform_negs`` false); when each chunk has its own, or the shared ones
  are no more than a chunk, they are the batch negatives' block's last columns instead
  ([S, B, chunk + U], one product: :meth:`BlockShape.merges`);
- every entity [S, B, N] (``all_negs``): the positive's own entity masked.

The backward applies the comparator's adjoint (:meth:`~pbgtrain.model.comparators.Comparator.all_pairs_grad`)
to the blocks' gradients, which are zeroed at the masked scores first: a masked score is a
constant.

>>> from pbgtrain.model.comparators import make_comparator
>>> from pbgtrain.model.negative_sampling import NegativeMode
>>> q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
>>> shape = BlockShape(NegativeMode.BATCH_UNIFORM, chunk=2, num_pos=3, uniform="none")
>>> (batch,) = negative_blocks(make_comparator("dot"), shape, [q], [q], [], masked=-9.0)
>>> batch[0].tolist()
[[-9.0, 0.0], [0.0, -9.0], [-9.0, -9.0]]
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from pbgtrain.model.comparators import Comparator
from pbgtrain.model.complex_ops import records
from pbgtrain.model.losses import LossFunction
from pbgtrain.model.negative_sampling import MASKED_SCORE, NegativeMode
from pbgtrain.model.precision import autocast_state, full_precision
from pbgtrain.model.score_kernels import EAGER, Kernels

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

    @property
    def num_chunks(self) -> int:
        return -(-self.num_pos // self.chunk)

    @property
    def padded(self) -> int:
        return self.num_chunks * self.chunk

    def chunked(self, x: Tensor) -> Tensor:
        """[S, B, …] → [S · chunks, chunk, …], zero rows appended to the last chunk."""
        return _pad(x, self.padded).view(x.shape[0] * self.num_chunks, self.chunk, *x.shape[2:])

    def real_rows(self, num_real: Tensor | None) -> Tensor | int:
        """How many rows are edges: ``num_real`` (a count on the device) when the batch is padded,
        else every positive (a number)."""
        return self.num_pos if num_real is None else num_real

    def mask_columns(self, scores: Tensor, value: float, real: Tensor | int) -> None:
        """Set the batch-negative columns of [S·chunks, chunk, W] (the first ``chunk`` of each
        row; W − chunk uniform columns may follow) that are no edge (past ``real``, a count on the
        device when the batch is padded, or past the batch in the last chunk) to ``value``."""
        if isinstance(real, int):
            if self.padded == real:
                return
            chunked = scores.view(-1, self.num_chunks, self.chunk, scores.shape[-1])
            first, offset = divmod(real, self.chunk)
            chunked[:, first, :, offset:self.chunk] = value
            if first + 1 < self.num_chunks:
                chunked[:, first + 1:, :, :self.chunk] = value
            return
        padding = torch.arange(self.padded, device=scores.device) >= real  # data: no count in the step's code
        chunked = scores.view(-1, self.num_chunks, self.chunk, scores.shape[-1])[..., :self.chunk]
        chunked.masked_fill_(padding.view(1, self.num_chunks, 1, self.chunk), value)

    def merges(self, num_uniform: int) -> bool:
        """Whether ``num_uniform`` uniform candidates per side join the batch negatives' product
        (one block of [batch | uniform] columns per chunk): when each chunk has its own, and when
        they are shared and no more than a chunk (shared by several chunks, they are copied per
        chunk: at most as many rows as the positives then). A rule of the configuration, not of
        the batch's length, so that a padded batch is scored as the batch itself."""
        return self.mode is NegativeMode.BATCH_UNIFORM and num_uniform > 0 and (
            self.uniform == "per_chunk" or (self.uniform == "shared" and num_uniform <= self.chunk))


def stack_sides(parts: Sequence[Tensor]) -> Tensor:
    """The sides' tensors on a new leading axis: a view for a single side, and for sides that
    follow each other in memory (rows gathered in one piece: the positives of lhs and rhs, or
    their uniform candidates, when nothing transforms them) unless autograd records them
    (``as_strided``'s backward assumes its input's own layout); else a copy.

    >>> rows = torch.arange(8.0).view(4, 2)
    >>> stack_sides([rows[:2], rows[2:]]).data_ptr() == rows.data_ptr()
    True
    """
    first = parts[0]
    if len(parts) == 1:
        return first.unsqueeze(0)
    if not records(*parts) and all(_follows(a, b) for a, b in itertools.pairwise(parts)):
        return first.as_strided((len(parts), *first.shape), (first.numel(), *first.stride()))
    return torch.stack(tuple(parts))


def _follows(a: Tensor, b: Tensor) -> bool:
    """Whether ``b`` is laid out as ``a`` and starts where ``a`` ends, in the same storage."""
    return (a.is_contiguous() and b.shape == a.shape and b.stride() == a.stride() and b.dtype == a.dtype
            and b.device == a.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and b.storage_offset() == a.storage_offset() + a.numel())


def _rows(x: Tensor, rows: int) -> Tensor:
    """The first ``rows`` rows of axis 1 (``x`` itself when it has no more)."""
    return x if x.shape[1] == rows else x[:, :rows]


def _pad(x: Tensor, rows: int) -> Tensor:
    """[S, B, …] with zero rows appended on axis 1 up to ``rows``."""
    if x.shape[1] == rows:
        return x
    return torch.cat((x, x.new_zeros(x.shape[0], rows - x.shape[1], *x.shape[2:])), dim=1)


@dataclass
class _Scored:
    """The blocks of one forward and what their adjoint needs: per block, the two operands and
    the scores (as the comparator gave them, masks applied)."""

    q: Tensor  # [S, B, D]
    blocks: list[Tensor]  # [S, B, K_i]
    operands: list[tuple[Tensor, Tensor, Tensor]]  # (queries, keys, scores) per block, chunked or not
    kinds: list[str]  # "batch" or the uniform layout, per block


def _score(cmp: Comparator, shape: BlockShape, masked: float, own: Tensor | None, real: Tensor | int, q: Tensor,
           p: Tensor, candidates: Sequence[Tensor]) -> _Scored:
    """The blocks of queries ``q`` [S, B, D] (positives ``p``, the batch negatives)."""
    sides, num_pos, dim = q.shape
    chunks, padded = shape.num_chunks, shape.padded
    out = _Scored(q, [], [], [])
    per_chunk = shape.uniform == "per_chunk"
    merged = bool(candidates) and shape.merges(candidates[0].shape[0] // (chunks if per_chunk else 1))
    if shape.mode is NegativeMode.BATCH_UNIFORM:
        qc, keys = shape.chunked(q), shape.chunked(p)
        if merged:
            c = stack_sides(candidates)
            if not per_chunk and chunks > 1:
                c = c.unsqueeze(1).expand(sides, chunks, -1, dim)  # a copy per chunk
            keys = torch.cat((keys, c.reshape(sides * chunks, -1, dim)), dim=1)
        scores = full_precision(cmp.all_pairs(qc, keys))
        scores.diagonal(dim1=1, dim2=2).fill_(masked)
        shape.mask_columns(scores, masked, real)
        out.operands.append((qc, keys, scores))
        out.blocks.append(_rows(scores.view(sides, padded, -1), num_pos))
        out.kinds.append("batch")
    if candidates and not merged and per_chunk:  # uniform negatives only, each chunk its own
        qc = shape.chunked(q)
        c = stack_sides(candidates).view(sides * chunks, -1, dim)
        scores = full_precision(cmp.all_pairs(qc, c))
        out.operands.append((qc, c, scores))
        out.blocks.append(_rows(scores.view(sides, padded, -1), num_pos))
        out.kinds.append("per_chunk")
    elif candidates and not merged:
        if len(candidates) == 1:  # one set of candidates for every side: one product for all queries
            c = candidates[0]
            scores = full_precision(cmp.all_pairs(q.view(sides * num_pos, dim), c)).view(sides, num_pos, -1)
        else:
            c = stack_sides(candidates)
            scores = full_precision(cmp.all_pairs(q, c))
        if own is not None:
            scores.scatter_(2, own.unsqueeze(2), masked)
        out.operands.append((q, c, scores))
        out.blocks.append(scores)
        out.kinds.append(shape.uniform)
    return out


def _adjoint(cmp: Comparator, shape: BlockShape, own: Tensor | None, real: Tensor | int, scored: _Scored,
             grads: Sequence[Tensor | None], *, owned: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``(d queries [S, B, D], d positives [S, B, D] or None, d candidates or None)`` from the
    blocks' gradients; ``owned``: the gradients may be overwritten (the masked entries zeroed)."""
    q = scored.q
    sides, num_pos, dim = q.shape
    chunk, chunks, padded = shape.chunk, shape.num_chunks, shape.padded
    dq: Tensor | None = None
    dp = dc = None
    for kind, (a, b, scores), g in zip(scored.kinds, scored.operands, grads, strict=True):
        if g is None:
            continue
        if kind in ("batch", "per_chunk"):
            if padded == num_pos and owned and g.is_contiguous():
                full = g
            else:
                full = g.new_zeros(sides, padded, g.shape[2])
                full[:, :num_pos] = g
            full = full.view(sides * chunks, chunk, -1)
            if kind == "batch":  # the masked scores are constants
                full.diagonal(dim1=1, dim2=2).zero_()
                shape.mask_columns(full, 0.0, real)
            da, db = cmp.all_pairs_grad(a, b, scores, full)
            da = _rows(full_precision(da).view(sides, padded, dim), num_pos)
            db = full_precision(db)
            if kind == "per_chunk":
                dc = db.view(sides, -1, dim)
            else:
                dp = _rows(db[:, :chunk].reshape(sides, padded, dim), num_pos)
                if db.shape[1] > chunk:  # the uniform candidates' columns, merged into the batch's block
                    dc = db[:, chunk:].reshape(sides, chunks, -1, dim)
                    dc = dc.reshape(sides, -1, dim) if shape.uniform == "per_chunk" or chunks == 1 else dc.sum(1)
        else:
            if own is not None:
                g = g.scatter_(2, own.unsqueeze(2), 0.0) if owned else g.scatter(2, own.unsqueeze(2), 0.0)
            if b.dim() == 2:  # shared by the sides
                da, dc = cmp.all_pairs_grad(a.view(sides * num_pos, dim), b, scores.view(sides * num_pos, -1),
                                            g.reshape(sides * num_pos, -1))
                da = full_precision(da).view(sides, num_pos, dim)
                dc = full_precision(dc).unsqueeze(0)
            else:
                da, dc = cmp.all_pairs_grad(a, b, scores, g)
                da, dc = full_precision(da), full_precision(dc)
        dq = da if dq is None else dq + da
    return (torch.zeros_like(q) if dq is None else dq), dp, dc


def _autocast(tensor: Tensor, state: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    if state is None:
        return contextlib.nullcontext()
    return torch.autocast(tensor.device.type, dtype=state)


def _split(grads: tuple[Tensor, Tensor | None, Tensor | None], num_sides: int,
           num_candidates: int) -> list[Tensor | None]:
    dq, dp, dc = grads
    out: list[Tensor | None] = list(dq.unbind(0))
    out += list(dp.unbind(0)) if dp is not None else [None] * num_sides
    if num_candidates:
        out += list(dc.unbind(0)) if dc is not None else [None] * num_candidates
    return out


def _unpack(num_sides: int, num_candidates: int,
            tensors: Sequence[Tensor]) -> tuple[Tensor, Tensor, Sequence[Tensor]]:
    """The stacked queries and positives [S, B, D] and the candidates of ``*tensors``."""
    candidates = tensors[2 * num_sides:] if num_candidates else ()
    return stack_sides(tensors[:num_sides]), stack_sides(tensors[num_sides:2 * num_sides]), candidates


class _NegativeBlocks(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, cmp: Comparator, shape: BlockShape, masked: float, own: Tensor | None,
                real: Tensor | int, num_sides: int, num_candidates: int, *tensors: Tensor) -> tuple[Tensor, ...]:
        q, p, candidates = _unpack(num_sides, num_candidates, tensors)
        scored = _score(cmp, shape, masked, own, real, q, p, candidates)
        ctx.args = (cmp, shape, own, real, num_sides, num_candidates, autocast_state(scored.q))
        ctx.scored = scored
        return tuple(scored.blocks)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        cmp, shape, own, real, num_sides, num_candidates, autocast = ctx.args
        scored: _Scored = ctx.scored
        del ctx.scored  # consumed: a second backward through this node fails loudly
        with _autocast(scored.q, autocast):
            grads_in = _adjoint(cmp, shape, own, real, scored, grads, owned=False)
        return (None,) * 7 + tuple(_split(grads_in, num_sides, num_candidates))


@dataclass(frozen=True)
class HeadGradients:
    """The loss of the sides scored together (summed over them), their violators [S] and the
    edges they were counted on (every edge of the batch, or a sample: a count, on the device when
    the batch is padded), and the loss's gradients in the inputs of a :class:`Head`: queries and
    positives [S, B, D], and the candidates stacked as given ([S or 1, K, D]; None without
    candidates)."""

    loss: Tensor
    violators: Tensor
    d_queries: Tensor
    d_positives: Tensor
    d_candidates: Tensor | None
    violators_counted_on: Tensor | int


class Head(Protocol):
    """A training step's scoring head: from the prepared queries, positives and candidates of the
    sides scored together (laid out as for :func:`negative_blocks`; each side's positive score is
    ``pair(query, positive)``) to the loss and its gradients in them. ``num_real`` (a count on the
    device) marks the rows from there on as padding: weight 0, no negative of the others, no
    violator. :class:`ScoreMatrixHead` writes the score matrices out; the attention form of the
    softmax loss (:class:`pbgtrain.model.attention.AttentionHead`) does not."""

    @property
    def name(self) -> str: ...

    def __call__(self, cmp: Comparator, shape: BlockShape, loss_fn: LossFunction, queries: Sequence[Tensor],
                 positives: Sequence[Tensor], candidates: Sequence[Tensor], *, weight: Tensor | None = None,
                 own: Tensor | None = None, num_real: Tensor | None = None) -> HeadGradients: ...


def head_inputs(shape: BlockShape, queries: Sequence[Tensor], positives: Sequence[Tensor],
                candidates: Sequence[Tensor], num_real: Tensor | None) -> tuple[Tensor, Tensor, Sequence[Tensor],
                                                                             Tensor | int]:
    """What every head starts from: the queries and positives stacked [S, B, D], the candidates
    (none when the layout takes none), and the count of real rows (a number without padding)."""
    real = shape.real_rows(num_real)
    return stack_sides(queries), stack_sides(positives), () if shape.uniform == "none" else candidates, real


class ScoreMatrixHead:
    """The score blocks written out, the loss's gradient in them (:meth:`LossFunction.value_and_grad`)
    and the comparator's adjoints: every loss and comparator. ``kernels``: the elementwise passes,
    eager or compiled (:mod:`pbgtrain.model.score_kernels`)."""

    def __init__(self, kernels: Kernels = EAGER) -> None:
        self.kernels = kernels

    @property
    def name(self) -> str:
        return "score matrices" + (" (compiled passes)" if self.kernels is not EAGER else "")

    @torch.no_grad()
    def __call__(self, cmp: Comparator, shape: BlockShape, loss_fn: LossFunction, queries: Sequence[Tensor],
                 positives: Sequence[Tensor], candidates: Sequence[Tensor], *, weight: Tensor | None = None,
                 own: Tensor | None = None, num_real: Tensor | None = None) -> HeadGradients:
        q, p, candidates, real = head_inputs(shape, queries, positives, candidates, num_real)
        pos = cmp.pair(q, p)
        scored = _score(cmp, shape, MASKED_SCORE, own, real, q, p, candidates)
        value, d_pos, d_blocks = loss_fn.value_and_grad(pos, tuple(scored.blocks), weight, self.kernels)
        live = None if num_real is None else torch.arange(shape.num_pos, device=q.device) < num_real
        violators = self.kernels.violators(pos, scored.blocks, live)  # padding rows violate nothing
        with _autocast(q, autocast_state(q)):
            dq, dp, dc = _adjoint(cmp, shape, own, real, scored, d_blocks, owned=True)
        dq_pos, dp_pos = cmp.pair_grad(q, p, pos, d_pos)
        return HeadGradients(value, violators, dq.add_(dq_pos) if dq.is_contiguous() else dq + dq_pos,
                             dp_pos if dp is None else dp_pos.add_(dp), dc, real)


training_head = ScoreMatrixHead()
"""The score-matrix head with the eager passes (the reference every head is compared with)."""


def negative_blocks(cmp: Comparator, shape: BlockShape, queries: Sequence[Tensor], positives: Sequence[Tensor],
                    candidates: Sequence[Tensor], *, masked: float, own: Tensor | None = None,
                    num_real: Tensor | None = None) -> tuple[Tensor, ...]:
    """The negative score blocks [S, B, K_i] of S sides (1 or 2) scored together.

    ``queries`` [B, D] per side: the other side of each edge, prepared; ``positives`` [B, D] per
    side (its batch negatives, when the mode takes them); ``candidates``: per side (or one
    for both sides when the same tensor serves both, ``all`` only), laid out as ``shape.uniform``
    says; ``own`` [S, B]: each positive's own entity (``all`` only); ``num_real``: the rows from
    there on are padding (a count on the device), masked as batch negatives.
    """
    if shape.uniform == "none":
        candidates = ()
    real = shape.real_rows(num_real)
    out: tuple[Tensor, ...] = _NegativeBlocks.apply(  # type: ignore[no-untyped-call]
        cmp, shape, masked, own, real, len(queries), len(candidates), *queries, *positives, *candidates)
    return out
