"""The softmax loss over negatives as attention: its value and gradients, no score matrix kept.

For queries q_i and candidates k_j (after the operators and ``prepare``, so that a score is the dot
product s_ij = q_i·k_j), the softmax loss of an edge whose positive k_pos(i) is among its candidates
(same-chunk negatives: the chunk's rows, its own at the diagonal; every entity: its own row) is
``w_i (LSE_j(s_ij) − s_i,pos(i))``, and with P = softmax(QKᵀ) over j:

- ∂L/∂q_i = w_i (Σ_j P_ij k_j − k_pos(i)): attention's output O = P·V with V = K;
- ∂L/∂k_j = Σ_i P_ij w_i q_i − (w_i q_i where j is q_i's positive): attention's gradient with
  respect to V given dO = w∘Q, which is Pᵀ·dO.

Attention kernels (FlashAttention and its kin behind ``torch.nn.functional.scaled_dot_product_attention``)
compute O in tiles with an online log-sum-exp and never write P out. Three coordinates are
appended to every vector (zero-padded up to a multiple of 8, which the kernels want; the dot
products of the vectors are unchanged):

- *mask* [:data:`~pbgtrain.model.negative_sampling.MASKED_SCORE` in queries, 1 in a key that is a
  padding row of the batch (past its real count, a device tensor), else 0]: a padding row is no
  negative of the others;
- *sink* [0, 1]: a sink key per group of keys, scored σ_i = pos_i + :data:`SINK_OFFSET` above the
  real keys by its query: its probability P_s,i, an output coordinate, gives the log-sum-exp
  without the kernel returning it: ``T_i = R_i / P_s,i = Σ_j exp(s_ij − σ_i)``;
- *ones* [1 in keys]: the output's coordinate R_i = Σ_j P'_ij, the mass of the real keys, with the
  relative precision of the output even when the sink dominates.

Where the sink's score goes is the core's (:attr:`AttentionCore.shifts_scores`): the query's sink
coordinate holds σ_i and its ones coordinate 0 (:class:`ExplicitAttention`), or the sink
coordinate 0 and the ones coordinate −σ_i (:class:`FusedAttention`: every real key scores s_ij − σ_i
and the sink 0, the same softmax). So the softmax over the real keys is P = P'/(P_s·T), its output
Σ P k = O'/(P_s·T), and the loss ``LSE − pos = σ + log T − pos``, all from the kernel's output. The
negatives of a batch may come as several groups of keys (a chunk's rows, and uniform candidates
shared by the whole batch): each group is one attention call with its own sink, and T and O' add up
over them. When an edge's positive is not among its keys (uniform negatives only), the loss is
``softplus(LSE − pos)`` and every gradient is scaled by sigmoid(LSE − pos), the share of the
negatives in the softmax.

The keys' gradient, with u_i = w_i q_i / T_i (the scale included), is ``Σ_i exp(s_ij − σ_i) u_i``.
:class:`FusedAttention` computes it as one more *forward* attention, of the keys over the queries:
in the shifted layout the product of key j's vector and query i's is exactly s_ij − σ_i, so with
the queries (and one zero row, scoring 0 against every key) as its keys and [u_i; e] (e: a unit
vector in a coordinate where u is 0) as its values, the output row of key j is
``(Σ_i exp(s_ij − σ_i) u_i + e) / (Σ_i exp(s_ij − σ_i) + 1)``: its vector coordinates over its e
coordinate are the gradient. The kernel's own backward would recompute P and also compute the
queries' and keys' gradients (five products where this takes two). :class:`ExplicitAttention`
keeps P and takes ``Pᵀ (u / P_s)``.

Range: per edge, ``LSE − pos`` is exact from −47 to +127 (the output's float exponent with the
sink 40 above the positive); an edge beyond +127 (a positive scored over 127 below its negatives'
log-sum-exp) counts 127 in the loss, and the fused core's keys' gradient from it is finite but no
longer exact (a key's row of the transposed attention underflows there). Below −47 the loss of an
edge is under 1e-20.

Violators (negatives scoring above their positive) need the scores, which this form never
holds: they are counted exactly on a sample, the first :data:`VIOLATOR_ROWS` edges of each
batch (the batch is in random order), and :attr:`~pbgtrain.model.negative_scores.HeadGradients.violators_counted_on`
says on how many; the stats record it (``violators_sampled_edges``).

:class:`ExplicitAttention` writes P out (a product, the softmax, two products): faster on a CPU,
and the GPU's way past :data:`FUSED_MAX_DIMENSION`. The head keeps the operands' buffers, their
constant coordinates written once: a step writes its vectors only (few launches when replayed).
Which kernel runs is :func:`fused_kernel`'s; ``--precision tf32`` changes nothing there (the
memory-efficient kernel's float32 products take three tf32 passes, float32's accuracy, anyway).

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
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from pbgtrain.model.comparators import Comparator
from pbgtrain.model.losses import LossFunction
from pbgtrain.model.negative_sampling import MASKED_SCORE, NegativeMode
from pbgtrain.model.negative_scores import BlockShape, HeadGradients, head_inputs, stack_sides
from pbgtrain.model.precision import autocast_state, full_precision

SINK_OFFSET = 40.0
"""How far above each positive its sink scores (the range of the loss readout: see the module doc)."""
VIOLATOR_ROWS = 64
"""Edges per batch and side whose violators are counted (the first ones of the batch)."""
FUSED_MAX_DIMENSION = 256
"""Longest vectors (padded) the fused core takes: FlashAttention's limit for half types (vectors of
up to 253 coordinates, with the three appended); longer ones take :class:`ExplicitAttention`."""
_EXTRA = 3  # mask, sink, ones
_TINY = 1e-38  # the smallest normal float32: a probability under it underflowed

Kernel = Literal["flash", "memory-efficient", "flash (CPU)", "explicit"]


@dataclass(frozen=True)
class Operands:
    """One group's operands in the padded layout (see the module doc): ``queries`` [G, M + 1, E],
    the group's M query rows then a zero row; ``keys`` [G, N + 1, E], its N key rows then the sink;
    ``values`` [G, M + 1, E], scratch for :meth:`AttentionCore.keys_grad` (zeros but for a 1 in the
    last row's sink coordinate: what it writes there is its own); ``dim``: the vectors' own
    coordinates (the mask, sink and ones coordinates follow)."""

    queries: Tensor
    keys: Tensor
    values: Tensor
    dim: int

    @property
    def mask(self) -> int:
        return self.dim

    @property
    def sink(self) -> int:
        return self.dim + 1

    @property
    def ones(self) -> int:
        return self.dim + 2

    @property
    def rows(self) -> Tensor:
        """The query rows [G, M, E] (the zero row left out)."""
        return self.queries[:, :-1]


class AttentionCore(Protocol):
    """Attention with V = K, and the keys' gradient from the queries' weights."""

    name: str
    shifts_scores: bool  # the query scores its real keys s − σ and its sink 0 (else s and σ)

    def attend(self, operands: Operands) -> tuple[Tensor, Any]:
        """``softmax(q kᵀ) k`` for the operands' query rows and keys ([G, M, E]), and what
        :meth:`keys_grad` needs."""
        ...

    def keys_grad(self, operands: Operands, saved: Any, queries: Tensor, scale: Tensor, sink_share: Tensor) -> Tensor:
        """``Σ_i exp(s_ij − σ_i) u_i`` [G, N, dim] for every key j but the sink, with u_i the
        ``queries`` [G, M, dim] scaled by ``scale`` [G, M], from the sink's share of each query's
        softmax (``sink_share`` [G, M], from the output of :meth:`attend`)."""
        ...


class _Buffers:
    """Tensors kept from call to call, their constant parts written once (``init``): every shape
    while ``keep`` (static shapes, a replayed step reading the buffers it was captured with),
    else the last one per role."""

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], Tensor] = {}
        self._last: dict[str, tuple[tuple[Any, ...], Tensor]] = {}

    def get(self, role: str, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, keep: bool,
            init: Callable[[Tensor], None]) -> Tensor:
        key = (role, shape, dtype, device)
        found = self._kept.get(key)
        if found is None and role in self._last and self._last[role][0] == key:
            found = self._last[role][1]
        if found is None:
            found = torch.zeros(shape, dtype=dtype, device=device)
            init(found)
            if keep:
                self._kept[key] = found
            else:
                self._last[role] = (key, found)
        return found


class FusedAttention:
    """``scaled_dot_product_attention`` (scale 1): tiles in on-chip memory, P never written out;
    the keys' gradient is one more forward call, of the keys over the queries (see the module doc)."""

    name = "fused"
    shifts_scores = True

    def attend(self, operands: Operands) -> tuple[Tensor, Any]:
        k = operands.keys.unsqueeze(0)
        return F.scaled_dot_product_attention(operands.rows.unsqueeze(0), k, k, scale=1.0).squeeze(0), None

    def keys_grad(self, operands: Operands, saved: Any, queries: Tensor, scale: Tensor, sink_share: Tensor) -> Tensor:
        values, dim, unit = operands.values, operands.dim, operands.sink
        torch.mul(queries, scale.unsqueeze(-1), out=values[:, :-1, :dim])
        out = full_precision(F.scaled_dot_product_attention(operands.keys[:, :-1].unsqueeze(0),
                                                            operands.queries.unsqueeze(0), values.unsqueeze(0),
                                                            scale=1.0).squeeze(0))
        # out[unit] = 1 / (Σ_i e_ji + 1): under 1e-38 only past the range (see the module doc)
        return out[..., :dim] / out[..., unit:unit + 1].clamp_min(_TINY)


class ExplicitAttention:
    """P materialised: ``bmm``, the softmax in float32 in place, ``bmm`` twice."""

    name = "explicit"
    shifts_scores = False

    def attend(self, operands: Operands) -> tuple[Tensor, Any]:
        k = operands.keys
        p = full_precision(torch.bmm(operands.rows, k.transpose(1, 2)))
        p = torch.softmax(p, dim=-1) if p.requires_grad else _softmax_(p)
        p = p.to(k.dtype)
        return torch.bmm(p, k), p

    def keys_grad(self, operands: Operands, saved: Any, queries: Tensor, scale: Tensor, sink_share: Tensor) -> Tensor:
        p: Tensor = saved
        d_out = operands.values[:, :-1]  # zeros past the vectors' coordinates
        torch.div(queries * scale.unsqueeze(-1), sink_share.unsqueeze(-1), out=d_out[..., :operands.dim])
        return torch.bmm(p.transpose(1, 2), d_out.to(p.dtype))[:, :-1, :operands.dim]


def _softmax_(x: Tensor) -> Tensor:
    """The softmax over the last axis, in place."""
    x.sub_(x.amax(-1, keepdim=True)).exp_()
    return x.div_(x.sum(-1, keepdim=True))


@dataclass(frozen=True)
class _KeyGroup:
    """One attention call: queries [G, M, D] in the group's layout, its blocks of keys (each
    [A, R or 1, n, D], written into the keys [G, N, D] viewed as [A, G / A, n, D]), the batch row of
    each of its first ``batch_keys`` keys ([G, batch_keys], None: no key is a row of the batch, so
    none is padding), how rows of [S, B, …] map to the group's queries and back, and how a gradient
    of the keys maps to the positives and candidates."""

    queries: Tensor
    blocks: tuple[Tensor, ...]
    batch_rows: Tensor | None
    to_group: Callable[[Tensor], Tensor]  # [S, B, …] → [G, M, …]
    from_group: Callable[[Tensor], Tensor]  # [G, M, …] → [S, B, …]
    split_keys: Callable[[Tensor, Tensor], Tensor | None]  # d keys, d positives (added to) → d candidates
    first_queries: Callable[[Tensor, int], Tensor]  # [G, M, …], rows → each side's first rows: [S, rows, …]
    first_keys: Callable[[Tensor], Tensor]  # [G, N, …] → what the first rows of each side see: [S or 1, N, …]
    own_first: bool  # the first rows' own keys are the diagonal (a chunk's rows)
    rows: int  # how many first rows each side has in one group (a chunk, or the batch)

    @property
    def num_keys(self) -> int:
        return sum(block.shape[2] for block in self.blocks)


def _groups(shape: BlockShape, q: Tensor, p: Tensor, candidates: Sequence[Tensor],
            batch_rows: Callable[[], Tensor]) -> list[_KeyGroup]:
    """The key groups of one layout (as :func:`~pbgtrain.model.negative_scores.negative_blocks`
    lays it out); ``batch_rows``: the batch row of each chunk's keys [S · chunks, chunk]."""
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

    def add_chunk_rows(d_keys: Tensor, d_positives: Tensor) -> None:
        """The chunk's rows' gradient [G, chunk, D] onto the positives [S, B, D]."""
        if padded == num_pos:
            d_positives.view(sides, chunks, chunk, dim).add_(d_keys.view(sides, chunks, chunk, dim))
        else:
            d_positives += unchunk(d_keys)

    out = []
    if shape.mode is NegativeMode.BATCH_UNIFORM:
        blocks = [shape.chunked(p).unsqueeze(1)]
        num_candidates = 0
        if merged:
            c = stack_sides(candidates)  # [S, U, D], or [S, chunks · U, D] per chunk
            c = c.reshape(sides, chunks, -1, dim) if per_chunk else c.unsqueeze(1)  # a copy per chunk when shared
            num_candidates = c.shape[2]
            blocks.append(c)

        def split_batch(d_keys: Tensor, d_positives: Tensor) -> Tensor | None:
            add_chunk_rows(d_keys[:, :chunk], d_positives)
            if not num_candidates:
                return None
            dc = d_keys[:, chunk:].view(sides, chunks, num_candidates, dim)
            return dc.reshape(sides, -1, dim) if per_chunk else dc.sum(1)

        out.append(_KeyGroup(shape.chunked(q), tuple(blocks), batch_rows(), shape.chunked, unchunk, split_batch,
                             first_rows_of_chunks, first_of_chunks, own_first=True, rows=chunk))
    if candidates and not merged and per_chunk:  # uniform negatives only, each chunk its own
        out.append(_KeyGroup(shape.chunked(q), (stack_sides(candidates).reshape(sides * chunks, 1, -1, dim),), None,
                             shape.chunked, unchunk, lambda d, _: d.reshape(sides, -1, dim),
                             first_rows_of_chunks, first_of_chunks, own_first=False, rows=chunk))
    elif candidates and not merged and len(candidates) == 1:  # one set of candidates for every side
        out.append(_KeyGroup(q.reshape(1, sides * num_pos, dim), (candidates[0].reshape(1, 1, -1, dim),), None,
                             lambda x: x.reshape(1, sides * num_pos, *x.shape[2:]),
                             lambda x: x.reshape(sides, num_pos, *x.shape[2:]), lambda d, _: d,
                             first_rows, lambda k: k, own_first=False, rows=num_pos))
    elif candidates and not merged:
        out.append(_KeyGroup(q, (stack_sides(candidates).unsqueeze(1),), None, lambda x: x, lambda x: x,
                             lambda d, _: d, first_rows, lambda k: k, own_first=False, rows=num_pos))
    return out


def _padded_width(dim: int) -> int:
    return -(-(dim + _EXTRA) // 8) * 8


class AttentionHead:
    """The softmax loss's head in the attention form, with the contract of
    :func:`~pbgtrain.model.negative_scores.training_head` (the loss function must be softmax and
    the comparator a dot product of prepared vectors: dot, or cos on normalised rows). It keeps
    the operands' buffers from call to call (see the module doc)."""

    def __init__(self, core: AttentionCore) -> None:
        self.core = core
        self._buffers = _Buffers()

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
        keep = num_real is not None  # a padded batch: the same shapes every step
        groups = _groups(shape, q, p, candidates, lambda: self._batch_rows(shape, sides, q.device, keep))
        if not groups or num_pos == 0:
            return _nothing(q, p, candidates, real)
        w = q.new_ones(num_pos) if weight is None else weight.to(q.dtype)
        autocast = autocast_state(q)
        dtype = q.dtype if autocast is None else autocast
        sink = (pos + SINK_OFFSET).to(dtype).to(q.dtype)  # the value the kernel sees
        total: Tensor | None = None
        weighted_keys: Tensor | None = None
        runs = []
        for index, group in enumerate(groups):
            operands = self._operands(index, group, sink, real, dtype, keep)
            out, saved = self.core.attend(operands)
            out = full_precision(out)
            sink_share = out[..., operands.sink].clamp_min(_TINY)
            ratios = out / sink_share.unsqueeze(-1)
            group_total = group.from_group(ratios[..., operands.ones])
            group_keys = group.from_group(ratios[..., :dim])
            total = group_total if total is None else total + group_total
            weighted_keys = group_keys if weighted_keys is None else weighted_keys + group_keys
            runs.append((group, operands, saved, sink_share))
        assert total is not None and weighted_keys is not None
        violators, counted = self._sampled_violators(runs, pos, own, real, keep)
        total = total.clamp_min(_TINY)
        gap = sink + total.log() - pos  # log-sum-exp of the negatives (with the positive, when among them) − pos
        among = shape.mode is not NegativeMode.UNIFORM
        loss = (gap if among else F.softplus(gap)).mul(w).sum()
        scale = w if among else w * torch.sigmoid(gap)  # [S, B]
        d_queries = (weighted_keys / total.unsqueeze(-1)).sub_(p).mul_(scale.unsqueeze(-1))
        d_positives = q * -scale.unsqueeze(-1)
        d_candidates: Tensor | None = None
        per_key = scale / total  # each query's weight in the keys' gradient: per_key · q
        for group, operands, saved, sink_share in runs:
            d_keys = full_precision(self.core.keys_grad(operands, saved, group.queries, group.to_group(per_key),
                                                        sink_share))
            dc = group.split_keys(d_keys, d_positives)
            if dc is not None:
                d_candidates = dc if d_candidates is None else d_candidates + dc
        return HeadGradients(loss, violators, d_queries, d_positives, d_candidates, counted)

    def _operands(self, index: int, group: _KeyGroup, sink: Tensor, real: Tensor | int, dtype: torch.dtype,
                  keep: bool) -> Operands:
        """The group's operands, written into the head's buffers: the queries' vectors and sink
        scores (σ, or −σ in the shifted layout), the keys' vectors and padding rows (the constant
        coordinates are there already)."""
        queries = group.queries
        groups, rows, dim = queries.shape
        width = _padded_width(dim)
        mask, sink_at, ones = dim, dim + 1, dim + 2  # as Operands names them

        def query_constants(buffer: Tensor) -> None:
            buffer[:, :-1, mask] = MASKED_SCORE

        def key_constants(buffer: Tensor) -> None:
            buffer[:, :-1, ones] = 1.0
            buffer[:, -1, sink_at] = 1.0

        def value_constants(buffer: Tensor) -> None:
            buffer[:, -1, sink_at] = 1.0

        def buffer(role: str, rows: int, init: Callable[[Tensor], None]) -> Tensor:
            return self._buffers.get(f"{role} {index}", (groups, rows, width), queries.device, dtype, keep, init)

        q_buffer = buffer("queries", rows + 1, query_constants)
        k_buffer = buffer("keys", group.num_keys + 1, key_constants)
        q_buffer[:, :-1, :dim] = queries
        if self.core.shifts_scores:
            torch.mul(group.to_group(sink), -1.0, out=q_buffer[:, :-1, ones])  # exact; any type out
        else:
            q_buffer[:, :-1, sink_at] = group.to_group(sink)
        start = 0
        for block in group.blocks:
            n = block.shape[2]
            k_buffer[:, start:start + n, :dim].view(block.shape[0], groups // block.shape[0], n, dim).copy_(block)
            start += n
        if group.batch_rows is not None:  # the keys past the batch's real rows
            torch.ge(group.batch_rows, real, out=k_buffer[:, :group.batch_rows.shape[1], mask])
        return Operands(q_buffer, k_buffer, buffer("values", rows + 1, value_constants), dim)

    def _batch_rows(self, shape: BlockShape, sides: int, device: torch.device, keep: bool) -> Tensor:
        """The batch row of each key of a chunk's rows [S · chunks, chunk] (kept: the same every step)."""
        chunks, chunk = shape.num_chunks, shape.chunk

        def rows(buffer: Tensor) -> None:
            buffer.view(sides, chunks, chunk).copy_(torch.arange(shape.padded, device=device).view(chunks, chunk))

        return self._buffers.get("batch rows", (sides * chunks, chunk), device, torch.long, keep, rows)

    def _sampled_violators(self, runs: Sequence[tuple[_KeyGroup, Operands, Any, Tensor]], pos: Tensor,
                           own: Tensor | None, real: Tensor | int, keep: bool) -> tuple[Tensor, Tensor | int]:
        """Violators of the first :data:`VIOLATOR_ROWS` edges of each side (no more than a chunk when a
        group is chunked), counted exactly: per side [S], and how many edges they were counted on.
        Scored from the attention's own operands (the mask coordinate masks the padding; the sink,
        the last key, is left out; in the shifted layout only the vectors and the mask, whose
        products are the scores themselves)."""
        sides = pos.shape[0]
        rows = min(VIOLATOR_ROWS, *(group.rows for group, *_ in runs))
        threshold = pos[:, :rows].unsqueeze(-1)
        counts: Tensor | None = None
        for group, operands, *_ in runs:
            width = operands.mask + 1 if self.core.shifts_scores else operands.queries.shape[-1]
            first_q = group.first_queries(operands.rows[..., :width], rows)  # [S, rows, E]
            seen = group.first_keys(operands.keys[:, :-1, :width])  # [S or 1, N, E]
            if seen.shape[0] == 1:  # one set for every side: one product, the keys not copied per side
                scores = full_precision(torch.mm(first_q.reshape(-1, width), seen[0].t()).view(sides, rows, -1))
            else:
                scores = full_precision(torch.bmm(first_q, seen.transpose(1, 2)))  # [S, rows, N]
            if group.own_first:
                scores.diagonal(dim1=-2, dim2=-1)[:, :rows].fill_(MASKED_SCORE)
            elif own is not None:
                scores.scatter_(-1, own[:, :rows].unsqueeze(-1), MASKED_SCORE)
            found = (scores > threshold).sum(-1)
            counts = found if counts is None else counts + found
        assert counts is not None
        if isinstance(real, int):  # every row an edge (real is the batch, rows no more than it)
            return counts.sum(-1), rows
        def positions_of(buffer: Tensor) -> None:
            buffer.copy_(torch.arange(rows, device=pos.device))

        positions = self._buffers.get("positions", (rows,), pos.device, torch.long, keep, positions_of)
        return counts.mul_(positions < real).sum(-1), real.clamp(max=rows)


def _nothing(q: Tensor, p: Tensor, candidates: Sequence[Tensor], real: Tensor | int) -> HeadGradients:
    """No negatives: no loss, no gradient, no violator (as the score-matrix head)."""
    dc = torch.zeros_like(stack_sides(candidates)) if candidates else None
    sides = q.shape[0]
    return HeadGradients(q.new_zeros(()), q.new_zeros(sides, dtype=torch.long), torch.zeros_like(q),
                         torch.zeros_like(p), dc, real)


def attention_core(device: torch.device, dimension: int) -> AttentionCore:
    """The faster core for ``device``: the fused kernels on a GPU (vectors up to
    :data:`FUSED_MAX_DIMENSION` long, padded), the explicit products on a CPU or for longer vectors."""
    if device.type == "cuda" and _padded_width(dimension) <= FUSED_MAX_DIMENSION:
        return FusedAttention()
    return ExplicitAttention()


def fused_kernel(device_type: str, dtype: torch.dtype, dimension: int) -> Kernel:
    """The kernel the head's attention calls run on ``device_type`` at ``dtype`` (the operands':
    float32 for fp32 and tf32, bfloat16 under bf16) for vectors of ``dimension``: what
    :func:`attention_core` and torch's dispatcher choose between them. On a CUDA GPU from sm80:
    FlashAttention for half types up to width 256, the memory-efficient kernel for float32 (Flash
    takes half types only; it would take any width, and half types past 256), the explicit core
    past width 256 (vectors of 253); on sm90 and sm100 with cuDNN newer than 9.15 torch tries
    cuDNN's attention first for half types (left out here). On a CPU, the flash kernel for CPUs.

    >>> fused_kernel("cuda", torch.float32, 100), fused_kernel("cuda", torch.bfloat16, 100)
    ('memory-efficient', 'flash')
    >>> fused_kernel("cuda", torch.bfloat16, 253), fused_kernel("cuda", torch.bfloat16, 254)
    ('flash', 'explicit')
    """
    if device_type != "cuda":
        return "flash (CPU)" if device_type == "cpu" else "explicit"
    width = _padded_width(dimension)
    if width > FUSED_MAX_DIMENSION:
        return "explicit"
    return "flash" if dtype in (torch.bfloat16, torch.float16) else "memory-efficient"
