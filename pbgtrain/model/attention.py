"""The softmax loss over negatives as attention: its value and gradients, no score matrix kept.

For queries q_i and candidates k_j (after the operators and ``prepare``, so that a score is the dot
product q_i·k_j), the softmax loss of an edge whose positive k_pos(i) is among its candidates
(same-chunk negatives: the chunk's rows, its own at the diagonal; every entity: its own row) is
``w_i (LSE_j(q_i·k_j) − q_i·k_pos(i))``, and with P = softmax(QKᵀ) over j:

- ∂L/∂q_i = w_i (Σ_j P_ij k_j − k_pos(i)): attention's output O = P·V with V = K;
- ∂L/∂k_j = Σ_i P_ij w_i q_i − (w_i q_i where j is q_i's positive): attention's gradient with
  respect to V given dO = w∘Q, which is Pᵀ·dO.

Attention kernels (FlashAttention and its kin behind ``torch.nn.functional.scaled_dot_product_attention``)
compute O in tiles with an online log-sum-exp and never write P out; :class:`FusedAttention` runs
them with V = K and takes their backward for V only. Three coordinates are appended to every
vector (zero-padded up to a multiple of 8, which the kernels want; dot products are unchanged):

- a *sink* key [0, 1, 0, 0] per group of keys, scored σ_i = pos_i + :data:`SINK_OFFSET` by its
  query (the query carries σ_i in that coordinate): its probability P_s,i, an output coordinate,
  gives the log-sum-exp without the kernel returning it: ``T_i = R_i / P_s,i = Σ_j exp(s_ij − σ_i)``;
- *ones* [0 in queries, 1 in keys]: the output's coordinate R_i = Σ_j P'_ij, the mass of the real
  keys, with the relative precision of the output even when the sink dominates;
- *mask* [1 in queries, 0 or −1e9 in keys]: a padding row of the batch (past its real count, a
  device tensor) is no negative of the others.

So the softmax over the real keys is P = P'/(P_s·T), its output Σ P k = O'/(P_s·T), and the loss
``LSE − pos = σ + log T − pos``, all from the kernel's output. The negatives of a batch may come as
several groups of keys (a chunk's rows, and uniform candidates shared by the whole batch): each
group is one attention call with its own sink, and T and O' add up over them. When an edge's
positive is not among its keys (uniform negatives only), the loss is ``softplus(LSE − pos)`` and
every gradient is scaled by sigmoid(LSE − pos), the share of the negatives in the softmax.

Range: per edge, ``LSE − pos`` is exact from −47 to +127 (the output's float exponent with the
sink 40 above the positive); an edge beyond +127 (a positive scored over 127 below its negatives'
log-sum-exp) counts 127 in the loss, while its gradients stay exact. Below −47 the loss of an
edge is under 1e-20.

Violators (negatives scoring above their positive) need the scores, which this form never
holds: they are counted exactly on a sample, the first :data:`VIOLATOR_ROWS` edges of each
batch (the batch is in random order), and :attr:`~pbgtrain.model.negative_scores.HeadGradients.violators_counted_on`
says on how many; the stats record it (``violators_sampled_edges``).

:class:`ExplicitAttention` computes the same outputs with P materialised (one matrix product,
the softmax, two more products): faster on a CPU, and the way on a GPU when the vectors are
longer than the attention kernels take (:data:`FUSED_MAX_DIMENSION`).

>>> from pbgtrain.model.comparators import make_comparator
>>> from pbgtrain.model.negative_scores import BlockShape, training_head
>>> from pbgtrain.model.losses import make_loss
>>> from pbgtrain.model.negative_sampling import NegativeMode
>>> g = torch.Generator().manual_seed(0)
>>> q, p = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
>>> shape = BlockShape(NegativeMode.BATCH_UNIFORM, chunk=3, num_pos=6, uniform="none")
>>> head = AttentionHead(ExplicitAttention())
>>> fused = head(make_comparator("dot"), shape, make_loss("softmax"), [q], [p], [])
>>> today = training_head(make_comparator("dot"), shape, make_loss("softmax"), [q], [p], [])
>>> torch.allclose(fused.loss, today.loss), torch.allclose(fused.d_queries, today.d_queries, atol=1e-6)
(True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from pbgtrain.model.comparators import Comparator
from pbgtrain.model.losses import LossFunction
from pbgtrain.model.negative_sampling import MASKED_SCORE, NegativeMode
from pbgtrain.model.negative_scores import BlockShape, HeadGradients, head_inputs, stack_sides
from pbgtrain.model.precision import autocast_state

SINK_OFFSET = 40.0
"""How far above each positive its sink scores (the range of the loss readout: see the module doc)."""
VIOLATOR_ROWS = 64
"""Edges per batch and side whose violators are counted (the first ones of the batch)."""
FUSED_MAX_DIMENSION = 256
"""Longest vectors (padded) the attention kernels take on a GPU (FlashAttention's limit); longer ones
take :class:`ExplicitAttention`."""
_EXTRA = 3  # sink, ones, mask
_TINY = 1e-38  # the smallest normal float32: a probability under it underflowed


class AttentionCore(Protocol):
    """Attention with V = K: the output, and the gradient of V from an output gradient."""

    name: str

    def attend(self, q: Tensor, k: Tensor) -> tuple[Tensor, Any]:
        """``softmax(q kᵀ) k`` for q [G, M, E], k [G, N, E] (the output, and what :meth:`keys_grad` needs)."""
        ...

    def keys_grad(self, saved: Any, d_out: Tensor) -> Tensor:
        """``Pᵀ d_out`` [G, N, E]: the gradient of V from ``d_out`` [G, M, E]."""
        ...


class FusedAttention:
    """``scaled_dot_product_attention`` (scale 1): tiles in on-chip memory, P never written out."""

    name = "fused"

    def attend(self, q: Tensor, k: Tensor) -> tuple[Tensor, Any]:
        with torch.enable_grad():
            v = k.detach().requires_grad_(True)
            out = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), scale=1.0)
        return out.detach().squeeze(0), (out, v)

    def keys_grad(self, saved: Any, d_out: Tensor) -> Tensor:
        out: Tensor = saved[0]
        v: Tensor = saved[1]
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(out, v, d_out.to(out.dtype).unsqueeze(0))  # [G, N, E]: v itself
        return grad


class ExplicitAttention:
    """P materialised: ``bmm``, the softmax in float32 in place, ``bmm`` twice."""

    name = "explicit"

    def attend(self, q: Tensor, k: Tensor) -> tuple[Tensor, Any]:
        p = torch.bmm(q, k.transpose(1, 2)).float()
        p = torch.softmax(p, dim=-1) if p.requires_grad else _softmax_(p)
        p = p.to(k.dtype)
        return torch.bmm(p, k), p

    def keys_grad(self, saved: Any, d_out: Tensor) -> Tensor:
        p: Tensor = saved
        return torch.bmm(p.transpose(1, 2), d_out.to(p.dtype))


def _softmax_(x: Tensor) -> Tensor:
    """The softmax over the last axis, in place."""
    x.sub_(x.amax(-1, keepdim=True)).exp_()
    return x.div_(x.sum(-1, keepdim=True))


@dataclass(frozen=True)
class _KeyGroup:
    """One attention call: queries [G, M, D] and keys [G, N, D] in the group's layout, the keys'
    additive mask ([G or 1, N], None: none), how rows of [S, B, …] map to the group's queries and
    back, and how a gradient of the keys maps to the positives and candidates."""

    queries: Tensor
    keys: Tensor
    mask: Tensor | None
    to_group: Callable[[Tensor], Tensor]  # [S, B, …] → [G, M, …]
    from_group: Callable[[Tensor], Tensor]  # [G, M, …] → [S, B, …]
    split_keys: Callable[[Tensor], tuple[Tensor | None, Tensor | None]]  # d keys → (d positives, d candidates)
    first_queries: Callable[[Tensor, int], Tensor]  # [G, M, …], rows → each side's first rows: [S, rows, …]
    first_keys: Callable[[Tensor], Tensor]  # [G, N, …] → what the first rows of each side see: [S or 1, N, …]
    own_first: bool  # the first rows' own keys are the diagonal (a chunk's rows)
    rows: int  # how many first rows each side has in one group (a chunk, or the batch)


def _groups(shape: BlockShape, q: Tensor, p: Tensor, candidates: Sequence[Tensor],
            num_real: Tensor | int) -> list[_KeyGroup]:
    """The key groups of one layout (as :func:`~pbgtrain.model.negative_scores.negative_blocks` lays it out)."""
    sides, num_pos, dim = q.shape
    chunks, chunk, padded = shape.num_chunks, shape.chunk, shape.padded
    per_chunk = shape.uniform == "per_chunk"
    merged = bool(candidates) and shape.merges(candidates[0].shape[0] // (chunks if per_chunk else 1))

    def unchunk(x: Tensor) -> Tensor:
        return x.reshape(sides, padded, *x.shape[2:])[:, :num_pos]

    def first_of_chunks(x: Tensor) -> Tensor:
        return x.view(sides, chunks, *x.shape[1:])[:, 0]

    def first_rows_of_chunks(x: Tensor, rows: int) -> Tensor:
        return first_of_chunks(x)[:, :rows]

    def first_rows(x: Tensor, rows: int) -> Tensor:
        return x.reshape(sides, num_pos, *x.shape[2:])[:, :rows]

    out = []
    if shape.mode is NegativeMode.BATCH_UNIFORM:
        keys = shape.chunked(p)
        rows = torch.arange(padded, device=q.device)
        mask = torch.where(rows >= num_real, MASKED_SCORE, 0.0).to(q.dtype).view(chunks, chunk).repeat(sides, 1)
        num_candidates = 0
        if merged:
            c = stack_sides(candidates)
            if not per_chunk:
                c = c.unsqueeze(1).expand(sides, chunks, -1, dim)  # a copy per chunk
            c = c.reshape(sides * chunks, -1, dim)
            num_candidates = c.shape[1]
            keys = torch.cat((keys, c), dim=1)
            mask = torch.cat((mask, mask.new_zeros(sides * chunks, num_candidates)), dim=1)

        def split_batch(d_keys: Tensor) -> tuple[Tensor | None, Tensor | None]:
            d_pos = unchunk(d_keys[:, :chunk])
            if not num_candidates:
                return d_pos, None
            dc = d_keys[:, chunk:].reshape(sides, chunks, num_candidates, dim)
            return d_pos, dc.reshape(sides, -1, dim) if per_chunk else dc.sum(1)

        out.append(_KeyGroup(shape.chunked(q), keys, mask, shape.chunked, unchunk, split_batch,
                             first_rows_of_chunks, first_of_chunks, own_first=True, rows=chunk))
    if candidates and not merged and per_chunk:  # uniform negatives only, each chunk its own
        out.append(_KeyGroup(shape.chunked(q), stack_sides(candidates).view(sides * chunks, -1, dim), None,
                             shape.chunked, unchunk, lambda d: (None, d.reshape(sides, -1, dim)),
                             first_rows_of_chunks, first_of_chunks, own_first=False, rows=chunk))
    elif candidates and not merged and len(candidates) == 1:  # one set of candidates for every side
        out.append(_KeyGroup(q.reshape(1, sides * num_pos, dim), candidates[0].unsqueeze(0), None,
                             lambda x: x.reshape(1, sides * num_pos, *x.shape[2:]),
                             lambda x: x.reshape(sides, num_pos, *x.shape[2:]), lambda d: (None, d),
                             first_rows, lambda k: k, own_first=False, rows=num_pos))
    elif candidates and not merged:
        out.append(_KeyGroup(q, stack_sides(candidates), None, lambda x: x, lambda x: x, lambda d: (None, d),
                             first_rows, lambda k: k, own_first=False, rows=num_pos))
    return out


def _padded_width(dim: int) -> int:
    return -(-(dim + _EXTRA) // 8) * 8


def _queries(group: _KeyGroup, sink: Tensor, width: int, dtype: torch.dtype) -> Tensor:
    """[q, σ, 0, 1, 0…] rows of the group's queries (one pass over q)."""
    q = group.queries
    dim = q.shape[-1]
    out = q.new_empty(*q.shape[:-1], width, dtype=dtype)
    out[..., :dim] = q
    out[..., dim:].zero_()
    out[..., dim] = group.to_group(sink)
    out[..., dim + 2] = 1.0
    return out


def _keys(group: _KeyGroup, width: int, dtype: torch.dtype) -> Tensor:
    """[k, 0, 1, mask, 0…] rows of the group's keys, then the sink [0, 1, 0, 0, 0…] (one pass over k)."""
    k = group.keys
    groups, num_keys, dim = k.shape
    out = k.new_empty(groups, num_keys + 1, width, dtype=dtype)
    out[:, :num_keys, :dim] = k
    out[:, :, dim:].zero_()
    out[:, num_keys, :dim].zero_()
    out[:, :num_keys, dim + 1] = 1.0
    if group.mask is not None:
        out[:, :num_keys, dim + 2] = group.mask
    out[:, num_keys, dim] = 1.0
    return out


class AttentionHead:
    """The softmax loss's head in the attention form, with the contract of
    :func:`~pbgtrain.model.negative_scores.training_head` (the loss function must be softmax and
    the comparator a dot product of prepared vectors: dot, or cos on normalised rows)."""

    def __init__(self, core: AttentionCore) -> None:
        self.core = core

    @property
    def name(self) -> str:
        return f"attention ({self.core.name})"

    @torch.no_grad()
    def __call__(self, cmp: Comparator, shape: BlockShape, loss_fn: LossFunction, queries: Sequence[Tensor],
                 positives: Sequence[Tensor], candidates: Sequence[Tensor], *, weight: Tensor | None = None,
                 own: Tensor | None = None, num_real: Tensor | None = None) -> HeadGradients:
        q, p, candidates, real = head_inputs(shape, queries, positives, candidates, num_real)
        sides, num_pos, dim = q.shape
        pos = cmp.pair(q, p)
        groups = _groups(shape, q, p, candidates, real)
        if not groups or num_pos == 0:
            return _nothing(q, p, candidates, real)
        w = q.new_ones(num_pos) if weight is None else weight.to(q.dtype)
        autocast = autocast_state(q)
        dtype = q.dtype if autocast is None else autocast
        width = _padded_width(dim)
        sink = (pos + SINK_OFFSET).to(dtype).to(q.dtype)  # the value the kernel sees
        total = q.new_zeros(sides, num_pos)
        weighted_keys = torch.zeros_like(q)
        runs = []
        operands = []
        for group in groups:
            operands.append((_queries(group, sink, width, dtype), _keys(group, width, dtype)))
            out, saved = self.core.attend(*operands[-1])
            out = out.float()
            sink_share = out[..., dim].clamp_min(_TINY)
            total += group.from_group(out[..., dim + 1] / sink_share)
            weighted_keys += group.from_group(out[..., :dim] / sink_share.unsqueeze(-1))
            runs.append((group, saved, sink_share))
        total.clamp_min_(_TINY)
        gap = sink + total.log() - pos  # log-sum-exp of the negatives (with the positive, when among them) − pos
        among = shape.mode is not NegativeMode.UNIFORM
        loss = (gap if among else F.softplus(gap)).mul(w).sum()
        scale = w if among else w * torch.sigmoid(gap)  # [S, B]
        d_queries = (weighted_keys / total.unsqueeze(-1)).sub_(p).mul_(scale.unsqueeze(-1))
        d_positives = q * -scale.unsqueeze(-1)
        d_candidates: Tensor | None = None
        per_key = q * (scale / total).unsqueeze(-1)
        for group, saved, sink_share in runs:
            d_out = q.new_zeros(*group.queries.shape[:-1], width, dtype=dtype)
            d_out[..., :dim] = group.to_group(per_key) / sink_share.unsqueeze(-1)
            d_keys = self.core.keys_grad(saved, d_out)[:, :-1, :dim].float()
            dp, dc = group.split_keys(d_keys)
            if dp is not None:
                d_positives += dp
            if dc is not None:
                d_candidates = dc if d_candidates is None else d_candidates + dc
        violators, counted = _sampled_violators(groups, operands, pos, own, real)
        return HeadGradients(loss, violators, d_queries, d_positives, d_candidates, counted)


def _nothing(q: Tensor, p: Tensor, candidates: Sequence[Tensor], real: Tensor | int) -> HeadGradients:
    """No negatives: no loss, no gradient, no violator (as the score-matrix head)."""
    dc = torch.zeros_like(stack_sides(candidates)) if candidates else None
    sides = q.shape[0]
    return HeadGradients(q.new_zeros(()), q.new_zeros(sides, dtype=torch.long), torch.zeros_like(q),
                         torch.zeros_like(p), dc, real)


def _sampled_violators(groups: Sequence[_KeyGroup], operands: Sequence[tuple[Tensor, Tensor]], pos: Tensor,
                       own: Tensor | None, real: Tensor | int) -> tuple[Tensor, Tensor | int]:
    """Violators of the first :data:`VIOLATOR_ROWS` edges of each side (no more than a chunk when a
    group is chunked), counted exactly: per side [S], and how many edges they were counted on.
    Scored from the attention's own operands (the mask coordinate masks the padding; the sink,
    the last key, is left out)."""
    sides = pos.shape[0]
    rows = min(VIOLATOR_ROWS, *(g.rows for g in groups))
    threshold = pos[:, :rows].unsqueeze(-1)
    counts = pos.new_zeros(sides, rows)
    for group, (queries, keys) in zip(groups, operands, strict=True):
        first_q = group.first_queries(queries, rows)  # [S, rows, E]
        seen = group.first_keys(keys[:, :-1])  # [S or 1, N, E]
        if seen.shape[0] == 1:  # one set for every side: one product, the keys not copied per side
            scores = torch.mm(first_q.reshape(-1, first_q.shape[-1]), seen[0].t()).view(sides, rows, -1).float()
        else:
            scores = torch.bmm(first_q, seen.transpose(1, 2)).float()  # [S, rows, N]
        if group.own_first:
            scores.diagonal(dim1=-2, dim2=-1)[:, :rows].fill_(MASKED_SCORE)
        elif own is not None:
            scores.scatter_(-1, own[:, :rows].unsqueeze(-1), MASKED_SCORE)
        counts += (scores > threshold).sum(-1)
    live = torch.arange(rows, device=pos.device) < real
    counted: Tensor | int = rows if isinstance(real, int) else real.clamp(max=rows)
    return counts.mul_(live).sum(-1).long(), counted


def attention_core(device: torch.device, dimension: int) -> AttentionCore:
    """The faster core for ``device``: the fused kernels on a GPU (vectors up to
    :data:`FUSED_MAX_DIMENSION` long, padded), the explicit products on a CPU or for longer vectors."""
    if device.type == "cuda" and _padded_width(dimension) <= FUSED_MAX_DIMENSION:
        return FusedAttention()
    return ExplicitAttention()
