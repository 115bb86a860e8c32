"""A side's way from looked-up rows to the embeddings it is scored with, forward and back.

Looked-up rows become scored embeddings through a few links: the entity type's global embedding
added (:class:`Shift`), the relation's operator (:class:`StaticOperator`, or
:class:`DynamicOperator` with each edge's relation), the comparator's ``prepare``
(:class:`Prepare`). A :class:`Chain` runs its links in order; :meth:`Chain.trace` keeps each
link's input so that :meth:`Traced.backward` can take a gradient back through them by hand
(each link's adjoint, the parameters' gradients added to their ``.grad``): the training step
needs no autograd graph. The same links run under autograd where something records them (the
reference forward of :func:`pbgtrain.model.scoring.forward_batch`).

>>> import torch
>>> from pbgtrain.model.operators import make_operator
>>> op = make_operator("diagonal", 2)
>>> traced = Chain((StaticOperator(op),)).trace(torch.tensor([[1.0, 2.0]]))
>>> traced.out.tolist()
[[1.0, 2.0]]
>>> traced.backward(torch.tensor([[3.0, 4.0]])).tolist(), op.diagonal.grad.tolist()
([[3.0, 4.0]], [3.0, 8.0])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from pbgtrain.model.comparators import Comparator
from pbgtrain.model.operators import DynamicOperator as DynamicOperatorModule
from pbgtrain.model.operators import Operator, add_grad, rows_sum
from pbgtrain.model.precision import full_precision


class Link(Protocol):
    """One step of a chain: ``forward`` and its adjoint (``x``: the input ``forward`` was given)."""

    def forward(self, x: Tensor) -> Tensor: ...

    def backward(self, x: Tensor, grad: Tensor) -> Tensor: ...


@dataclass(frozen=True, eq=False)
class Shift:
    """``x + emb``: an entity type's global embedding."""

    emb: Tensor

    def forward(self, x: Tensor) -> Tensor:
        return x + self.emb

    def backward(self, x: Tensor, grad: Tensor) -> Tensor:
        add_grad(self.emb, rows_sum(grad))
        return grad


@dataclass(frozen=True)
class StaticOperator:
    """A static relation's operator (its products at the step's precision, the result in float32)."""

    op: Operator

    def forward(self, x: Tensor) -> Tensor:
        return full_precision(self.op(x))

    def backward(self, x: Tensor, grad: Tensor) -> Tensor:
        return self.op.vjp(x, grad)


@dataclass(frozen=True, eq=False)
class DynamicOperator:
    """A dynamic operator, each row taking its edge's relation."""

    op: DynamicOperatorModule
    rel: Tensor

    def forward(self, x: Tensor) -> Tensor:
        return full_precision(self.op(x, self.rel))

    def backward(self, x: Tensor, grad: Tensor) -> Tensor:
        return self.op.vjp(x, self.rel, grad)


@dataclass(frozen=True)
class Prepare:
    """The comparator's ``prepare`` (cos normalises)."""

    cmp: Comparator

    def forward(self, x: Tensor) -> Tensor:
        return self.cmp.prepare(x)

    def backward(self, x: Tensor, grad: Tensor) -> Tensor:
        return self.cmp.prepare_grad(x, grad)


@dataclass(frozen=True, eq=False)
class Traced:
    """A chain's output ``out`` and the input of each of its links."""

    chain: Chain
    out: Tensor
    inputs: tuple[Tensor, ...]

    def backward(self, grad: Tensor) -> Tensor:
        """The gradient of the chain's input from ``grad``, the gradient of ``out``."""
        for link, x in zip(reversed(self.chain.links), reversed(self.inputs), strict=True):
            grad = link.backward(x, grad)
        return grad


@dataclass(frozen=True)
class Chain:
    """Links run in order; an empty chain hands its input back as it is."""

    links: tuple[Link, ...]

    @classmethod
    def of(cls, *links: Link | None) -> Chain:
        """The links given (None: none there)."""
        return cls(tuple(link for link in links if link is not None))

    def __call__(self, x: Tensor) -> Tensor:
        for link in self.links:
            x = link.forward(x)
        return x

    def trace(self, x: Tensor) -> Traced:
        """Run the chain, keeping what :meth:`Traced.backward` needs."""
        inputs = []
        for link in self.links:
            inputs.append(x)
            x = link.forward(x)
        return Traced(self, x, tuple(inputs))


def prepare_link(cmp: Comparator) -> Prepare | None:
    """The comparator's link, None when its ``prepare`` returns its input as it is."""
    return Prepare(cmp) if cmp.prepares else None


def shift_link(emb: Tensor | None) -> Shift | None:
    return None if emb is None else Shift(emb)


def static_operator_link(op: Operator) -> StaticOperator | None:
    """None for the identity operator (``none``)."""
    return None if type(op).forward is Operator.forward else StaticOperator(op)


def dynamic_operator_link(op: DynamicOperatorModule, rel: Tensor) -> DynamicOperator | None:
    return None if type(op).forward is DynamicOperatorModule.forward else DynamicOperator(op, rel)
