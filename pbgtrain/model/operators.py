"""Relation operators, static (one per relation) and dynamic (a leading relation axis).

Parameter names and shapes are those of :data:`pbgio.spec.checkpoint.OPERATORS`, so a model's
state dict maps one to one onto checkpoint names. Initial values are the original's: diagonal
ones, translation zeros, linear identity, complex real ones and imaginary zeros, which makes
every operator start as the identity. :func:`draw_parameters` draws them at random instead
(``pbgtrain fit --operator-init random``).

>>> op = make_operator("complex_diagonal", 4)
>>> sorted(name for name, _ in op.named_parameters())
['imag', 'real']
>>> op(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).tolist()
[[1.0, 2.0, 3.0, 4.0]]
>>> dyn = make_dynamic_operator("diagonal", 4, num_relations=3)
>>> tuple(dyn.diagonals.shape)
(3, 4)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pbgio.spec.checkpoint import OPERATORS, param_shapes
from pbgtrain.model.complex_ops import complex_multiply, complex_multiply_grads, modulus_cube_sum
from pbgtrain.model.precision import full_precision


def _cube_sum(*params: Tensor, dims: tuple[int, ...] | None = None) -> Tensor:
    total = params[0].new_zeros(())
    for p in params:
        cube = p.abs().pow(3)
        total = total + (cube.sum() if dims is None else cube.sum(dims))
    return total


def _check_even(name: str, dimension: int) -> None:
    if name == "complex_diagonal" and dimension % 2:
        raise ValueError(f"complex_diagonal needs an even dimension, found {dimension}")


def add_grad(param: Tensor, grad: Tensor) -> None:
    """Add ``grad`` (a tensor of its own, which ``param.grad`` may become) to ``param.grad``;
    nothing for a parameter that takes no gradient (a frozen type's global embedding)."""
    if not param.requires_grad:
        return
    if grad.dtype != param.dtype:
        grad = grad.to(param.dtype)
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


def add_row_grads(param: Tensor, rel: Tensor, rows: Tensor) -> None:
    """Add the per-edge gradients ``rows`` [B, ...] to the rows ``rel`` [B] of ``param.grad``."""
    if not param.requires_grad:
        return
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    param.grad.index_add_(0, rel, rows if rows.dtype == param.dtype else rows.to(param.dtype))


def rows_sum(x: Tensor) -> Tensor:
    """[..., D] summed over every leading axis: [D] (a new tensor)."""
    return x.reshape(-1, x.shape[-1]).sum(0)


def draw_parameters(module: nn.Module, scale: float, generator: torch.Generator) -> None:
    """Every parameter of ``module`` drawn from ``scale · N(0, 1)``, as the entities are initialised.

    Identity operators make every relation start by scoring an entity highest against itself:
    a model of mostly symmetric relations (WN18RR) then spends many epochs unlearning that.
    Random ones, as in Lacroix et al.'s ComplEx-N3, start without that bias.

    >>> op = make_operator("complex_diagonal", 4)
    >>> draw_parameters(op, 1e-3, torch.Generator().manual_seed(0))
    >>> bool(op.real.abs().max() < 0.01), bool((op.imag != 0).all())
    (True, True)
    """
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator).mul_(scale))


def _linear_vjp(matrix: nn.Parameter, x: Tensor, grad: Tensor) -> Tensor:
    """``x ↦ x Mᵀ``: adds ``gradᵀ x`` to M's gradient, returns ``grad M``."""
    flat_grad, flat_x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
    add_grad(matrix, torch.matmul(flat_grad.t(), flat_x))
    return full_precision(torch.matmul(grad, matrix.detach()))


# --- static operators (one module per relation; applied to [..., D]) ---------------------


class Operator(nn.Module):
    """A static operator: one set of parameters, applied to embeddings of shape [..., D]."""

    name = ""
    complex_valued = False

    def __init__(self, dimension: int) -> None:
        super().__init__()
        self.dimension = dimension

    def forward(self, x: Tensor) -> Tensor:
        return x

    def vjp(self, x: Tensor, grad: Tensor) -> Tensor:
        """The gradient of ``x`` [..., D] from ``grad``, the gradient of ``self(x)``; the
        parameters' gradients are added to their ``.grad`` (:func:`add_grad`)."""
        return grad

    def cube_sum(self) -> Tensor | None:
        """Σ|p|³ over the parameters, as N3 counts them (complex: modulus); None without any."""
        return None

    def magnitudes(self) -> list[tuple[Tensor, tuple[nn.Parameter, ...]]]:
        """What N3 cubes, without autograd: each magnitude tensor (``|p|``, or the modulus of a
        complex pair) with the parameters it is the magnitude of (:meth:`cube_sum` = Σ m³)."""
        return [(p.detach().abs(), (p,)) for p in self.parameters()]


class IdentityOperator(Operator):
    name = "none"


class DiagonalOperator(Operator):
    name = "diagonal"

    def __init__(self, dimension: int) -> None:
        super().__init__(dimension)
        self.diagonal = nn.Parameter(torch.ones(dimension))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.diagonal

    def vjp(self, x: Tensor, grad: Tensor) -> Tensor:
        add_grad(self.diagonal, rows_sum(grad * x))
        return grad * self.diagonal.detach()

    def cube_sum(self) -> Tensor | None:
        return _cube_sum(self.diagonal)


class TranslationOperator(Operator):
    name = "translation"

    def __init__(self, dimension: int) -> None:
        super().__init__(dimension)
        self.translation = nn.Parameter(torch.zeros(dimension))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.translation

    def vjp(self, x: Tensor, grad: Tensor) -> Tensor:
        add_grad(self.translation, rows_sum(grad))
        return grad

    def cube_sum(self) -> Tensor | None:
        return _cube_sum(self.translation)


class LinearOperator(Operator):
    """x ↦ M x (``out[i] = Σ_j M[i, j] x[j]``)."""

    name = "linear"

    def __init__(self, dimension: int) -> None:
        super().__init__(dimension)
        self.linear_transformation = nn.Parameter(torch.eye(dimension))

    def forward(self, x: Tensor) -> Tensor:
        return torch.matmul(x, self.linear_transformation.t())

    def vjp(self, x: Tensor, grad: Tensor) -> Tensor:
        return _linear_vjp(self.linear_transformation, x, grad)

    def cube_sum(self) -> Tensor | None:
        return _cube_sum(self.linear_transformation)


class AffineOperator(Operator):
    """x ↦ M x + t."""

    name = "affine"

    def __init__(self, dimension: int) -> None:
        super().__init__(dimension)
        self.linear_transformation = nn.Parameter(torch.eye(dimension))
        self.translation = nn.Parameter(torch.zeros(dimension))

    def forward(self, x: Tensor) -> Tensor:
        return torch.matmul(x, self.linear_transformation.t()) + self.translation

    def vjp(self, x: Tensor, grad: Tensor) -> Tensor:
        add_grad(self.translation, rows_sum(grad))
        return _linear_vjp(self.linear_transformation, x, grad)

    def cube_sum(self) -> Tensor | None:
        return _cube_sum(self.linear_transformation, self.translation)


class ComplexDiagonalOperator(Operator):
    """Complex multiplication; embeddings are [real half | imaginary half]."""

    name = "complex_diagonal"
    complex_valued = True

    def __init__(self, dimension: int) -> None:
        _check_even(self.name, dimension)
        super().__init__(dimension)
        self.real = nn.Parameter(torch.ones(dimension // 2))
        self.imag = nn.Parameter(torch.zeros(dimension // 2))

    def forward(self, x: Tensor) -> Tensor:
        return complex_multiply(x, self.real, self.imag)

    def vjp(self, x: Tensor, grad: Tensor) -> Tensor:
        trains = self.real.requires_grad or self.imag.requires_grad
        dx, d_real, d_imag = complex_multiply_grads(x, self.real.detach(), self.imag.detach(), grad, parameters=trains)
        if d_real is not None and d_imag is not None:
            add_grad(self.real, rows_sum(d_real))
            add_grad(self.imag, rows_sum(d_imag))
        assert dx is not None
        return dx

    def cube_sum(self) -> Tensor | None:
        return modulus_cube_sum(self.real, self.imag)

    def magnitudes(self) -> list[tuple[Tensor, tuple[nn.Parameter, ...]]]:
        return [(torch.hypot(self.real.detach(), self.imag.detach()), (self.real, self.imag))]


# --- dynamic operators (parameters [R, ...]; applied per edge to [B, D] with rel [B]) -----


class DynamicOperator(nn.Module):
    """A dynamic operator: parameters with a leading relation axis, applied per edge."""

    name = ""
    complex_valued = False

    def __init__(self, dimension: int, num_relations: int) -> None:
        super().__init__()
        self.dimension = dimension
        self.num_relations = num_relations

    def forward(self, x: Tensor, rel: Tensor) -> Tensor:
        """Apply relation ``rel[b]`` to ``x[b]``; x is [B, D], rel is a LongTensor [B]."""
        return x

    def vjp(self, x: Tensor, rel: Tensor, grad: Tensor) -> Tensor:
        """The gradient of ``x`` [B, D] from ``grad``, the gradient of ``self(x, rel)``; the
        parameters' gradients are added to their ``.grad`` rows (:func:`add_row_grads`)."""
        return grad

    def cube_sums(self) -> Tensor | None:
        """Σ|p|³ per relation, shape [R] (complex: modulus); None without parameters."""
        return None

    def magnitudes(self) -> list[tuple[Tensor, tuple[nn.Parameter, ...]]]:
        """As :meth:`Operator.magnitudes`, the relation axis first (:meth:`cube_sums` = Σ m³ per relation)."""
        return [(p.detach().abs(), (p,)) for p in self.parameters()]


def _by_relation(rel: Tensor) -> tuple[Tensor, Tensor, list[int], list[int]]:
    """``(order, inverse, relations, counts)``: the edges sorted by relation, the permutation
    back, and each distinct relation with its number of edges."""
    order = torch.argsort(rel)
    uniq, counts = torch.unique_consecutive(rel.index_select(0, order), return_counts=True)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return order, inverse, uniq.tolist(), counts.tolist()


def _per_relation_matmul(x: Tensor, mats: Tensor, rel: Tensor) -> Tensor:
    """``out[b] = mats[rel[b]] @ x[b]``, one matmul per distinct relation (no [B, D, D] gather)."""
    order, inverse, relations, counts = _by_relation(rel)
    pieces = torch.split_with_sizes(x.index_select(0, order), counts)
    out_sorted = torch.cat([
        torch.matmul(piece, mats[r].t()) for piece, r in zip(pieces, relations, strict=True)
    ]) if pieces else x[:0]
    return out_sorted.index_select(0, inverse)


def _per_relation_matmul_vjp(mats: nn.Parameter, x: Tensor, rel: Tensor, grad: Tensor) -> Tensor:
    """The adjoint of :func:`_per_relation_matmul`: adds ``Σ_b grad[b]ᵀ x[b]`` to the rows
    ``rel`` of the matrices' gradient, returns ``grad[b] M[rel[b]]``."""
    order, inverse, relations, counts = _by_relation(rel)
    xs = torch.split_with_sizes(x.index_select(0, order), counts)
    gs = torch.split_with_sizes(grad.index_select(0, order), counts)
    weights = mats.detach()
    if mats.requires_grad:
        d_mats = torch.zeros_like(mats)
        for r, xr, gr in zip(relations, xs, gs, strict=True):
            d_mats[r] = full_precision(torch.matmul(gr.t(), xr))
        add_grad(mats, d_mats)
    dx_sorted = torch.cat([full_precision(torch.matmul(gr, weights[r])) for r, gr in zip(relations, gs, strict=True)]) \
        if gs else grad[:0]
    return dx_sorted.index_select(0, inverse)


class IdentityDynamicOperator(DynamicOperator):
    name = "none"


class DiagonalDynamicOperator(DynamicOperator):
    name = "diagonal"

    def __init__(self, dimension: int, num_relations: int) -> None:
        super().__init__(dimension, num_relations)
        self.diagonals = nn.Parameter(torch.ones(num_relations, dimension))

    def forward(self, x: Tensor, rel: Tensor) -> Tensor:
        return x * self.diagonals.index_select(0, rel)

    def vjp(self, x: Tensor, rel: Tensor, grad: Tensor) -> Tensor:
        add_row_grads(self.diagonals, rel, grad * x)
        return grad * self.diagonals.detach().index_select(0, rel)

    def cube_sums(self) -> Tensor | None:
        return _cube_sum(self.diagonals, dims=(1,))


class TranslationDynamicOperator(DynamicOperator):
    name = "translation"

    def __init__(self, dimension: int, num_relations: int) -> None:
        super().__init__(dimension, num_relations)
        self.translations = nn.Parameter(torch.zeros(num_relations, dimension))

    def forward(self, x: Tensor, rel: Tensor) -> Tensor:
        return x + self.translations.index_select(0, rel)

    def vjp(self, x: Tensor, rel: Tensor, grad: Tensor) -> Tensor:
        add_row_grads(self.translations, rel, grad)
        return grad

    def cube_sums(self) -> Tensor | None:
        return _cube_sum(self.translations, dims=(1,))


class LinearDynamicOperator(DynamicOperator):
    name = "linear"

    def __init__(self, dimension: int, num_relations: int) -> None:
        super().__init__(dimension, num_relations)
        self.linear_transformations = nn.Parameter(torch.eye(dimension).repeat(num_relations, 1, 1))

    def forward(self, x: Tensor, rel: Tensor) -> Tensor:
        return _per_relation_matmul(x, self.linear_transformations, rel)

    def vjp(self, x: Tensor, rel: Tensor, grad: Tensor) -> Tensor:
        return _per_relation_matmul_vjp(self.linear_transformations, x, rel, grad)

    def cube_sums(self) -> Tensor | None:
        return _cube_sum(self.linear_transformations, dims=(1, 2))


class AffineDynamicOperator(DynamicOperator):
    name = "affine"

    def __init__(self, dimension: int, num_relations: int) -> None:
        super().__init__(dimension, num_relations)
        self.linear_transformations = nn.Parameter(torch.eye(dimension).repeat(num_relations, 1, 1))
        self.translations = nn.Parameter(torch.zeros(num_relations, dimension))

    def forward(self, x: Tensor, rel: Tensor) -> Tensor:
        return _per_relation_matmul(x, self.linear_transformations, rel) + self.translations.index_select(0, rel)

    def vjp(self, x: Tensor, rel: Tensor, grad: Tensor) -> Tensor:
        add_row_grads(self.translations, rel, grad)
        return _per_relation_matmul_vjp(self.linear_transformations, x, rel, grad)

    def cube_sums(self) -> Tensor | None:
        return _cube_sum(self.linear_transformations, dims=(1, 2)) + _cube_sum(self.translations, dims=(1,))


class ComplexDiagonalDynamicOperator(DynamicOperator):
    name = "complex_diagonal"
    complex_valued = True

    def __init__(self, dimension: int, num_relations: int) -> None:
        _check_even(self.name, dimension)
        super().__init__(dimension, num_relations)
        self.real = nn.Parameter(torch.ones(num_relations, dimension // 2))
        self.imag = nn.Parameter(torch.zeros(num_relations, dimension // 2))

    def forward(self, x: Tensor, rel: Tensor) -> Tensor:
        return complex_multiply(x, self.real.index_select(0, rel), self.imag.index_select(0, rel))

    def vjp(self, x: Tensor, rel: Tensor, grad: Tensor) -> Tensor:
        trains = self.real.requires_grad or self.imag.requires_grad
        dx, d_real, d_imag = complex_multiply_grads(x, self.real.detach().index_select(0, rel),
                                                    self.imag.detach().index_select(0, rel), grad, parameters=trains)
        if d_real is not None and d_imag is not None:
            add_row_grads(self.real, rel, d_real)
            add_row_grads(self.imag, rel, d_imag)
        assert dx is not None
        return dx

    def cube_sums(self) -> Tensor | None:
        return modulus_cube_sum(self.real, self.imag, per_row=True)

    def magnitudes(self) -> list[tuple[Tensor, tuple[nn.Parameter, ...]]]:
        return [(torch.hypot(self.real.detach(), self.imag.detach()), (self.real, self.imag))]


STATIC_OPERATORS: dict[str, type[Operator]] = {
    cls.name: cls for cls in (IdentityOperator, DiagonalOperator, TranslationOperator, LinearOperator,
                              AffineOperator, ComplexDiagonalOperator)
}
DYNAMIC_OPERATORS: dict[str, type[DynamicOperator]] = {
    cls.name: cls for cls in (IdentityDynamicOperator, DiagonalDynamicOperator, TranslationDynamicOperator,
                              LinearDynamicOperator, AffineDynamicOperator, ComplexDiagonalDynamicOperator)
}
assert set(STATIC_OPERATORS) == set(DYNAMIC_OPERATORS) == set(OPERATORS)


def _check_shapes(module: nn.Module, name: str, dimension: int, num_relations: int | None) -> None:
    expected = param_shapes(name, dimension=dimension, num_dynamic_rels=num_relations)
    actual = {pname: tuple(p.shape) for pname, p in module.named_parameters()}
    assert actual == expected, (actual, expected)


def make_operator(name: str, dimension: int) -> Operator:
    """The static operator ``name`` for embeddings of ``dimension``."""
    if name not in STATIC_OPERATORS:
        raise ValueError(f"unknown operator {name!r}; expected one of {sorted(STATIC_OPERATORS)}")
    op = STATIC_OPERATORS[name](dimension)
    _check_shapes(op, name, dimension, None)
    return op


def make_dynamic_operator(name: str, dimension: int, num_relations: int) -> DynamicOperator:
    """The dynamic operator ``name`` with ``num_relations`` relations."""
    if name not in DYNAMIC_OPERATORS:
        raise ValueError(f"unknown operator {name!r}; expected one of {sorted(DYNAMIC_OPERATORS)}")
    op = DYNAMIC_OPERATORS[name](dimension, num_relations)
    _check_shapes(op, name, dimension, num_relations)
    return op
