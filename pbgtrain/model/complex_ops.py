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


class _ComplexMultiply(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, real: Tensor, imag: Tensor) -> Tensor:
        ctx.save_for_backward(x, real, imag)
        return _complex_product(x, real, imag)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, real, imag = ctx.saved_tensors
        dx, d_real, d_imag = complex_multiply_grads(x, real, imag, grad, inputs=ctx.needs_input_grad[0],
                                                    parameters=ctx.needs_input_grad[1] or ctx.needs_input_grad[2])
        return (dx, None if d_real is None else d_real.sum_to_size(real.shape),
                None if d_imag is None else d_imag.sum_to_size(imag.shape))


def complex_multiply_grads(x: Tensor, real: Tensor, imag: Tensor, grad: Tensor, *, inputs: bool = True,
                           parameters: bool = True) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients of :func:`complex_multiply` from ``grad``: of ``x``, and of the operator per
    row of ``x`` ([..., D/2] each, before any sum over rows that share a parameter); None where
    not asked for."""
    half = x.shape[-1] // 2
    x_re, x_im = x[..., :half], x[..., half:]
    g_re, g_im = grad[..., :half], grad[..., half:]
    dx = d_real = d_imag = None
    if inputs:
        dx = torch.empty_like(x)
        torch.mul(g_re, real, out=dx[..., :half])
        dx[..., :half].addcmul_(g_im, imag)
        torch.mul(g_im, real, out=dx[..., half:])
        dx[..., half:].addcmul_(g_re, imag, value=-1)
    if parameters:
        d_real = torch.addcmul(g_re * x_re, g_im, x_im)
        d_imag = torch.addcmul(g_im * x_re, g_re, x_im, value=-1)
    return dx, d_real, d_imag


def _complex_product(x: Tensor, real: Tensor, imag: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    x_re, x_im = x[..., :half], x[..., half:]
    out = x.new_empty(x.shape)
    out_re, out_im = out[..., :half], out[..., half:]
    torch.mul(x_re, real, out=out_re)
    out_re.addcmul_(x_im, imag, value=-1)
    torch.mul(x_re, imag, out=out_im)
    out_im.addcmul_(x_im, real)
    return out


def records(*tensors: Tensor) -> bool:
    """Whether autograd records an operation on ``tensors`` (else a Function's apply is overhead only)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def complex_multiply(x: Tensor, real: Tensor, imag: Tensor) -> Tensor:
    """(a + ib)(c + id) with x = [a | b] (last axis) and the operator c + id (broadcast to a)."""
    if x.shape[-1] % 2:
        raise ValueError(f"complex embeddings need an even dimension, found {x.shape[-1]}")
    if not records(x, real, imag):
        return _complex_product(x, real, imag)
    out: Tensor = _ComplexMultiply.apply(x, real, imag)  # type: ignore[no-untyped-call]
    return out


class _ModulusCubeSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, real: Tensor, imag: Tensor, per_row: bool) -> Tensor:
        modulus = torch.hypot(real, imag)
        ctx.save_for_backward(real, imag, modulus)
        ctx.per_row = per_row
        return _cube_sum(modulus, per_row)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        real, imag, modulus = ctx.saved_tensors
        scale = modulus * 3 * (grad.unsqueeze(-1) if ctx.per_row else grad)
        return real * scale, imag * scale, None


def modulus_cube_sum(real: Tensor, imag: Tensor, per_row: bool = False) -> Tensor:
    """Σ |real + i·imag|³, over everything or (``per_row``) over the last axis; the gradient
    ``3|z|·(re, im)`` is defined at 0."""
    if not records(real, imag):
        return _cube_sum(torch.hypot(real, imag), per_row)
    out: Tensor = _ModulusCubeSum.apply(real, imag, per_row)  # type: ignore[no-untyped-call]
    return out


def _cube_sum(modulus: Tensor, per_row: bool) -> Tensor:
    cubes = modulus.square().mul_(modulus)
    return cubes.sum(-1) if per_row else cubes.sum()
