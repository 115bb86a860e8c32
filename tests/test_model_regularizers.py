"""The N3 regularizer against a direct computation: embeddings and operator parameters, gradients included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from pbgio.spec.checkpoint import OPERATORS
from pbgtrain.model import EmbeddingModel, ModelSpec, RelationSpec
from pbgtrain.model.scoring import regularization

COEF = 0.7


def _cube_magnitudes(x: Tensor, complex_valued: bool) -> Tensor:
    """Σ over coordinates of |x|³, or of |re + i·im|³ over the (re, im) pairs."""
    flat = x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x.reshape(1, -1)
    total = x.new_zeros(())
    for row in flat:
        if complex_valued:
            half = row.shape[0] // 2
            for k in range(half):
                total = total + torch.sqrt(row[k] ** 2 + row[half + k] ** 2) ** 3
        else:
            for v in row:
                total = total + torch.abs(v) ** 3
    return total


def _operator_cubes(params: dict[str, Tensor], complex_valued: bool) -> Tensor:
    if complex_valued:
        re, im = params["real"], params["imag"]
        return sum((torch.sqrt(a ** 2 + b ** 2) ** 3 for a, b in zip(re.flatten(), im.flatten(), strict=True)),
                   re.new_zeros(()))
    zero = torch.zeros((), dtype=torch.float64)
    return sum((_cube_magnitudes(p.reshape(1, -1), False) for p in params.values()), zero)


def _spec(name: str, dim: int, dynamic_rels: int | None) -> ModelSpec:
    return ModelSpec({"e": dim}, (RelationSpec("r", "e", "e", operator=name),), num_dynamic_rels=dynamic_rels,
                     regularization_coef=COEF, global_emb=False, comparator="dot")


def _randomize(model: EmbeddingModel, gen: torch.Generator) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))


@pytest.mark.parametrize("name", sorted(OPERATORS))
@given(num=st.integers(1, 4), half=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_static_n3_matches_reference(name: str, num: int, half: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    model = EmbeddingModel(_spec(name, 2 * half, None)).double()
    _randomize(model, gen)
    u = torch.randn(num, 2 * half, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(num, 2 * half, generator=gen, dtype=torch.float64, requires_grad=True)
    reg = regularization(model, 0, u, v)
    assert reg is not None
    is_complex = name == "complex_diagonal"
    params = {k.split(".")[-1]: p.detach().clone().requires_grad_(True) for k, p in model.named_parameters()}
    u_ref, v_ref = u.detach().clone().requires_grad_(True), v.detach().clone().requires_grad_(True)
    ref = COEF * (_cube_magnitudes(u_ref, is_complex) + _cube_magnitudes(v_ref, is_complex)
                  + num * _operator_cubes(params, is_complex))
    torch.testing.assert_close(reg, ref)
    reg.backward()
    ref.backward()
    torch.testing.assert_close(u.grad, u_ref.grad)
    torch.testing.assert_close(v.grad, v_ref.grad)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, params[k.split(".")[-1]].grad)


@pytest.mark.parametrize("name", sorted(OPERATORS))
@given(num=st.integers(1, 5), half=st.integers(1, 3), num_rels=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_dynamic_n3_matches_reference(name: str, num: int, half: int, num_rels: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    model = EmbeddingModel(_spec(name, 2 * half, num_rels)).double()
    _randomize(model, gen)
    u = torch.randn(num, 2 * half, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(num, 2 * half, generator=gen, dtype=torch.float64, requires_grad=True)
    rel = torch.randint(num_rels, (num,), generator=gen)
    reg = regularization(model, rel, u, v)
    assert reg is not None
    is_complex = name == "complex_diagonal"
    u_ref, v_ref = u.detach().clone().requires_grad_(True), v.detach().clone().requires_grad_(True)
    params = {k: p.detach().clone().requires_grad_(True) for k, p in model.named_parameters()}
    ops = total = torch.zeros((), dtype=torch.float64)
    for side in ("lhs", "rhs"):
        side_params = {k.split(".")[-1]: p for k, p in params.items() if k.startswith(side)}
        for b in range(num):  # each edge counts its relation's parameters
            ops = ops + _operator_cubes({k: p[int(rel[b])] for k, p in side_params.items()}, is_complex)
    # the embeddings count once per direction (lhs negatives with h, rhs negatives with g)
    total = 2 * (_cube_magnitudes(u_ref, is_complex) + _cube_magnitudes(v_ref, is_complex)) + ops
    ref = COEF * total
    torch.testing.assert_close(reg, ref)
    reg.backward()
    ref.backward()
    torch.testing.assert_close(u.grad, u_ref.grad)
    torch.testing.assert_close(v.grad, v_ref.grad)
    for k, p in model.named_parameters():
        zeros = torch.zeros_like(p)
        ref_grad = params[k].grad
        torch.testing.assert_close(zeros if p.grad is None else p.grad, zeros if ref_grad is None else ref_grad)


def test_zero_coefficient_disables_the_regularizer() -> None:
    spec = ModelSpec({"e": 2}, (RelationSpec("r", "e", "e", operator="diagonal"),), regularization_coef=0.0)
    assert regularization(EmbeddingModel(spec), 0, torch.ones(1, 2), torch.ones(1, 2)) is None


def test_hand_computed_value() -> None:
    spec = ModelSpec({"e": 2}, (RelationSpec("r", "e", "e", operator="complex_diagonal"),),
                     regularization_coef=0.5, global_emb=False)
    model = EmbeddingModel(spec)  # real = 1, imag = 0: operator modulus 1 per coordinate pair
    u = torch.tensor([[3.0, 4.0], [0.0, 1.0]])  # moduli 5 and 1
    v = torch.tensor([[0.0, 2.0], [1.0, 0.0]])  # moduli 2 and 1
    reg = regularization(model, 0, u, v)
    assert reg is not None
    assert reg.item() == pytest.approx(0.5 * (125 + 1 + 8 + 1 + 2 * 1))
