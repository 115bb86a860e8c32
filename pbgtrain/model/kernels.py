"""Fused elementwise pieces with hand-written backward passes (fewer passes and temporaries).

>>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # 1 + 3i, 2 + 4i
>>> complex_multiply(x, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])).tolist()
[[-3.0, 2.0, 1.0, 4.0]]
>>> modulus_cube_sum(torch.tensor([3.0]), torch.tensor([4.0])).item()
125.0
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pbgtrain.model.precision import autocast_state, full_precision


class _ComplexMultiply(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, real: Tensor, imag: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        x_re, x_im = x[..., :half], x[..., half:]
        out = x.new_empty(x.shape)
        out_re, out_im = out[..., :half], out[..., half:]
        torch.mul(x_re, real, out=out_re)
        out_re.addcmul_(x_im, imag, value=-1)
        torch.mul(x_re, imag, out=out_im)
        out_im.addcmul_(x_im, real)
        ctx.save_for_backward(x, real, imag)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, real, imag = ctx.saved_tensors
        half = x.shape[-1] // 2
        x_re, x_im = x[..., :half], x[..., half:]
        g_re, g_im = grad[..., :half], grad[..., half:]
        dx = d_real = d_imag = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty_like(x)
            torch.mul(g_re, real, out=dx[..., :half])
            dx[..., :half].addcmul_(g_im, imag)
            torch.mul(g_im, real, out=dx[..., half:])
            dx[..., half:].addcmul_(g_re, imag, value=-1)
        if ctx.needs_input_grad[1]:
            d_real = torch.addcmul(g_re * x_re, g_im, x_im).sum_to_size(real.shape)
        if ctx.needs_input_grad[2]:
            d_imag = torch.addcmul(g_im * x_re, g_re, x_im, value=-1).sum_to_size(imag.shape)
        return dx, d_real, d_imag


def complex_multiply(x: Tensor, real: Tensor, imag: Tensor) -> Tensor:
    """(a + ib)(c + id) with x = [a | b] (last axis) and the operator c + id (broadcast to a)."""
    if x.shape[-1] % 2:
        raise ValueError(f"complex embeddings need an even dimension, found {x.shape[-1]}")
    out: Tensor = _ComplexMultiply.apply(x, real, imag)  # type: ignore[no-untyped-call]
    return out


class _ModulusCubeSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, real: Tensor, imag: Tensor, per_row: bool) -> Tensor:
        modulus = torch.hypot(real, imag)
        cubes = modulus.square().mul_(modulus)
        ctx.save_for_backward(real, imag, modulus)
        ctx.per_row = per_row
        return cubes.sum(-1) if per_row else cubes.sum()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        real, imag, modulus = ctx.saved_tensors
        scale = modulus * 3 * (grad.unsqueeze(-1) if ctx.per_row else grad)
        return real * scale, imag * scale, None


def modulus_cube_sum(real: Tensor, imag: Tensor, per_row: bool = False) -> Tensor:
    """Σ |real + i·imag|³, over everything or (``per_row``) over the last axis; the gradient
    ``3|z|·(re, im)`` is defined at 0."""
    out: Tensor = _ModulusCubeSum.apply(real, imag, per_row)  # type: ignore[no-untyped-call]
    return out


class _MaskedBatchDot(torch.autograd.Function):
    """Same-chunk dot scores [C, S, S] of ``query`` and ``positives`` (padded to C·S rows with
    zeros), each positive's own score and the padding columns set to ``masked``, returned as
    [B, S]. The forward writes the mask into the matmul's output in place; the backward never
    touches the [B, S] gradient: the masked entries' share of the two matmul gradients
    (the diagonal) is subtracted afterwards, O(B·D), and padding rows/columns are zeros."""

    @staticmethod
    def forward(ctx: Any, query: Tensor, positives: Tensor, chunk: int, masked: float) -> Tensor:
        num_pos, dim = query.shape
        num_chunks = -(-num_pos // chunk)
        padded = num_chunks * chunk
        q = pad_rows(query, padded).view(num_chunks, chunk, dim)
        p = pad_rows(positives, padded).view(num_chunks, chunk, dim)
        scores = full_precision(torch.bmm(q, p.transpose(1, 2)))  # masked in float32 (exact MASKED_SCORE)
        scores.diagonal(dim1=1, dim2=2).fill_(masked)
        if padded > num_pos:
            scores[-1, :, chunk - (padded - num_pos):] = masked
        ctx.save_for_backward(q, p)
        ctx.num_pos = num_pos
        ctx.autocast = autocast_state(query)
        return scores.view(padded, chunk)[:num_pos]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, p = ctx.saved_tensors
        num_chunks, chunk, dim = q.shape
        num_pos = ctx.num_pos
        g = pad_rows(grad, num_chunks * chunk).view(num_chunks, chunk, chunk)
        own = g.diagonal(dim1=1, dim2=2).unsqueeze(-1)  # [C, S, 1]: the masked entries' gradient
        dq = dp = None
        with torch.autocast(g.device.type, dtype=ctx.autocast or torch.bfloat16, enabled=ctx.autocast is not None):
            if ctx.needs_input_grad[0]:
                dq = full_precision(torch.bmm(g, p)).sub_(own * p).view(-1, dim)[:num_pos]
            if ctx.needs_input_grad[1]:
                dp = full_precision(torch.bmm(g.transpose(1, 2), q)).sub_(own * q).view(-1, dim)[:num_pos]
        return dq, dp, None, None


def pad_rows(x: Tensor, rows: int) -> Tensor:
    """``x`` [N, D] with zero rows appended up to ``rows``."""
    return x if x.shape[0] == rows else torch.nn.functional.pad(x, (0, 0, 0, rows - x.shape[0]))


def masked_batch_dot(query: Tensor, positives: Tensor, chunk: int, masked: float) -> Tensor:
    """Dot scores of each positive against the other positives of its chunk of ``chunk`` rows:
    [B, D] × [B, D] → [B, chunk], with a positive's own score and the columns past the end of
    the batch set to ``masked`` (the gradient there is zero, as after ``masked_fill``).

    >>> q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> masked_batch_dot(q, q, chunk=2, masked=-9.0).tolist()
    [[-9.0, 0.0], [0.0, -9.0], [-9.0, -9.0]]
    """
    if query.shape != positives.shape or query.dim() != 2:
        raise ValueError(f"expected two [B, D] tensors, found {tuple(query.shape)} and {tuple(positives.shape)}")
    out: Tensor = _MaskedBatchDot.apply(query, positives, chunk, masked)  # type: ignore[no-untyped-call]
    return out
