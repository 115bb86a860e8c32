"""The N3 regularizer (Lacroix et al. 2018): ``coef · Σ|x|³`` over the factors of each edge.

The factors are the positive lhs and rhs embeddings of the batch (as looked up, before the
global embedding and the operator) and, once per edge, the parameters of the edge's relation
operator. With a complex operator (complex_diagonal) both use the modulus of each
(real, imaginary) pair instead of the absolute value of each coordinate.

>>> import torch
>>> reg = N3Regularizer(0.5)
>>> reg.embedding_term([torch.tensor([[1.0, -2.0]])], complex_valued=False).item()
9.0
>>> reg.embedding_term([torch.tensor([[3.0, 4.0]])], complex_valued=True).item()
125.0
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from pbgtrain.model.kernels import modulus_cube_sum


def cubed_magnitudes(x: Tensor, complex_valued: bool) -> Tensor:
    """Σ|x|³, or Σ(re² + im²)^{3/2} over [real half | imaginary half] when ``complex_valued``."""
    if complex_valued:
        half = x.shape[-1] // 2
        return modulus_cube_sum(x[..., :half], x[..., half:])
    return x.abs().pow(3).sum()


def cubed_magnitudes_and_grad(x: Tensor, complex_valued: bool) -> tuple[Tensor, Tensor]:
    """:func:`cubed_magnitudes` of ``x`` and its gradient in ``x`` (3·|x|·x, or 3·|z|·(re, im)
    per pair), without autograd."""
    if complex_valued:
        half = x.shape[-1] // 2
        modulus = torch.hypot(x[..., :half], x[..., half:])
        value = modulus.square().mul_(modulus).sum()
        modulus.mul_(3)
        return value, x * torch.cat((modulus, modulus), dim=-1)
    magnitude = x.abs()
    value = magnitude.square().mul_(magnitude).sum()
    return value, magnitude.mul_(x).mul_(3)


class N3Regularizer:
    """N3 with weight ``coef``; 0 disables it (``enabled`` is False), a negative one applies."""

    def __init__(self, coef: float) -> None:
        self.coef = coef

    @property
    def enabled(self) -> bool:
        return self.coef != 0  # a negative coefficient applies too, as in the original

    def embedding_term(self, embeddings: Sequence[Tensor], complex_valued: bool) -> Tensor:
        """Σ over the given embedding tensors of their cubed magnitudes (not yet × coef)."""
        total = embeddings[0].new_zeros(())
        for x in embeddings:
            total = total + cubed_magnitudes(x, complex_valued)
        return total

    @staticmethod
    def static_operator_term(cube_sum: Tensor | None, num_edges: int) -> Tensor | None:
        """A static operator's Σ|p|³, counted once per edge of the batch."""
        return None if cube_sum is None else cube_sum * num_edges

    @staticmethod
    def dynamic_operator_term(cube_sums: Tensor | None, rel: Tensor) -> Tensor | None:
        """Σ over edges of the Σ|p|³ of each edge's relation (``cube_sums`` is [R])."""
        if cube_sums is None:
            return None
        return cube_sums.index_select(0, rel).sum()  # no bincount: its length would depend on the ids

    def __call__(self, embedding_term: Tensor, operator_terms: Sequence[Tensor | None]) -> Tensor:
        total = embedding_term
        for term in operator_terms:
            if term is not None:
                total = total + term
        return self.coef * total
