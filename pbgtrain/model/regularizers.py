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

from pbgtrain.model.complex_ops import modulus_cube_sum


def cubed_magnitudes(x: Tensor, complex_valued: bool, live: Tensor | None = None) -> Tensor:
    """Σ|x|³, or Σ(re² + im²)^{3/2} over [real half | imaginary half] when ``complex_valued``;
    ``live`` [rows] (1.0 or 0.0) weighs each row (None: every row counts)."""
    if complex_valued:
        half = x.shape[-1] // 2
        if live is None:
            return modulus_cube_sum(x[..., :half], x[..., half:])
        return (modulus_cube_sum(x[..., :half], x[..., half:], per_row=True) * live).sum()
    cubes = x.abs().pow(3)
    return cubes.sum() if live is None else (cubes.sum(-1) * live).sum()


def cubed_magnitudes_and_grad(x: Tensor, complex_valued: bool,
                              live: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """:func:`cubed_magnitudes` of ``x`` and its gradient in ``x`` (3·|x|·x, or 3·|z|·(re, im)
    per pair), without autograd; ``live`` [rows] weighs each row."""
    if complex_valued:
        half = x.shape[-1] // 2
        magnitude = torch.hypot(x[..., :half], x[..., half:])
        if live is not None:
            magnitude.mul_(live.unsqueeze(-1))  # a padding row: no value, no gradient (|live| is 0 or 1)
        value = magnitude.square().mul_(magnitude).sum()
        magnitude.mul_(3)
        return value, x * torch.cat((magnitude, magnitude), dim=-1)
    magnitude = x.abs()
    if live is not None:
        magnitude.mul_(live.unsqueeze(-1))
    value = magnitude.square().mul_(magnitude).sum()
    return value, magnitude.mul_(x).mul_(3)


class N3Regularizer:
    """N3 with weight ``coef``; 0 disables it (``enabled`` is False), a negative one applies."""

    def __init__(self, coef: float) -> None:
        self.coef = coef

    @property
    def enabled(self) -> bool:
        return self.coef != 0  # a negative coefficient applies too, as in the original

    def embedding_term(self, embeddings: Sequence[Tensor], complex_valued: bool,
                       live: Tensor | None = None) -> Tensor:
        """Σ over the given embedding tensors of their cubed magnitudes (not yet × coef); ``live``
        [rows] weighs each row (a padding row 0)."""
        total = embeddings[0].new_zeros(())
        for x in embeddings:
            total = total + cubed_magnitudes(x, complex_valued, live)
        return total

    @staticmethod
    def static_operator_term(cube_sum: Tensor | None, num_edges: int | Tensor) -> Tensor | None:
        """A static operator's Σ|p|³, counted once per edge of the batch."""
        return None if cube_sum is None else cube_sum * num_edges

    @staticmethod
    def dynamic_operator_term(cube_sums: Tensor | None, rel: Tensor, live: Tensor | None = None) -> Tensor | None:
        """Σ over edges of the Σ|p|³ of each edge's relation (``cube_sums`` is [R]; ``live``: each edge's weight)."""
        if cube_sums is None:
            return None
        per_edge = cube_sums.index_select(0, rel)  # no bincount: its length would depend on the ids
        return per_edge.sum() if live is None else (per_edge * live).sum()

    def __call__(self, embedding_term: Tensor, operator_terms: Sequence[Tensor | None]) -> Tensor:
        total = embedding_term
        for term in operator_terms:
            if term is not None:
                total = total + term
        return self.coef * total
