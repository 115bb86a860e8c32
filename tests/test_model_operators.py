"""Relation operators (static and dynamic) against direct reference computations, gradients included."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from pbgio.config import parse_config
from pbgio.spec.checkpoint import OPERATORS, expected_model_params, param_shapes, private_to_public
from pbgtrain.model import EmbeddingModel, make_dynamic_operator, make_operator
from pbgtrain.model.complex_ops import complex_multiply, modulus_cube_sum

NAMES = sorted(OPERATORS)


def _ref_static(name: str, params: dict[str, Tensor], x: Tensor) -> Tensor:
    """Row by row, coordinate by coordinate, straight from the definitions."""
    rows = []
    for row in x:
        d = row.shape[0]
        if name == "none":
            out = [row[k] for k in range(d)]
        elif name == "diagonal":
            out = [params["diagonal"][k] * row[k] for k in range(d)]
        elif name == "translation":
            out = [row[k] + params["translation"][k] for k in range(d)]
        elif name in ("linear", "affine"):
            m = params["linear_transformation"]
            out = [sum(m[i, j] * row[j] for j in range(d)) for i in range(d)]
            if name == "affine":
                out = [out[i] + params["translation"][i] for i in range(d)]
        else:
            z = torch.complex(row[: d // 2], row[d // 2:]) * torch.complex(params["real"], params["imag"])
            out = [*z.real, *z.imag]
        rows.append(torch.stack(out))
    return torch.stack(rows)


def _ref_dynamic(name: str, params: dict[str, Tensor], x: Tensor, rel: Tensor) -> Tensor:
    static_names = {"diagonals": "diagonal", "translations": "translation",
                    "linear_transformations": "linear_transformation", "real": "real", "imag": "imag"}
    out = []
    for b in range(x.shape[0]):
        r = int(rel[b])
        per_rel = {static_names[k]: v[r] for k, v in params.items()}
        out.append(_ref_static(name, per_rel, x[b:b + 1])[0])
    return torch.stack(out)


def _random_params(module: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))


def _leaf_copies(module: torch.nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone().requires_grad_(True) for k, v in module.named_parameters()}


def _assert_matches_reference(module: torch.nn.Module, apply: Callable[[Tensor], Tensor], x: Tensor,
                              reference: Callable[[dict[str, Tensor], Tensor], Tensor], gen: torch.Generator) -> None:
    """``apply(x)`` equals ``reference(copies of module's parameters, copy of x)``, and so do the
    gradients of a random projection of it with respect to x and every parameter of ``module``."""
    x_ref = x.detach().clone().requires_grad_(True)
    ref_params = _leaf_copies(module)
    out, ref = apply(x), reference(ref_params, x_ref)
    torch.testing.assert_close(out, ref)
    w = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    for pname, p in module.named_parameters():
        torch.testing.assert_close(p.grad, ref_params[pname].grad)


@pytest.mark.parametrize("name", NAMES)
@given(num=st.integers(1, 5), half=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_static_operator_matches_reference(name: str, num: int, half: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    dim = 2 * half
    op = make_operator(name, dim).double()
    _random_params(op, gen)
    x = torch.randn(num, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    _assert_matches_reference(op, op, x, lambda params, x_ref: _ref_static(name, params, x_ref), gen)


@pytest.mark.parametrize("name", NAMES)
@given(num=st.integers(1, 7), half=st.integers(1, 3), num_rels=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_dynamic_operator_matches_reference(name: str, num: int, half: int, num_rels: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    dim = 2 * half
    op = make_dynamic_operator(name, dim, num_rels).double()
    _random_params(op, gen)
    x = torch.randn(num, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    rel = torch.randint(num_rels, (num,), generator=gen)
    _assert_matches_reference(op, lambda v: op(v, rel), x,
                              lambda params, x_ref: _ref_dynamic(name, params, x_ref, rel), gen)


def test_static_operator_applies_to_leading_axes() -> None:
    op = make_operator("linear", 3).double()
    _random_params(op, torch.Generator().manual_seed(1))
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    torch.testing.assert_close(op(x), _ref_static("linear", dict(op.named_parameters()), x.view(8, 3)).view(2, 4, 3))


@pytest.mark.parametrize("name", NAMES)
def test_initial_operators_are_the_identity_with_the_original_values(name: str) -> None:
    x = torch.randn(5, 6)
    torch.testing.assert_close(make_operator(name, 6)(x), x)
    torch.testing.assert_close(make_dynamic_operator(name, 6, 3)(x, torch.tensor([0, 2, 1, 1, 0])), x)
    expected = {"diagonal": 1.0, "diagonals": 1.0, "translation": 0.0, "translations": 0.0, "real": 1.0, "imag": 0.0}
    for op in (make_operator(name, 6), make_dynamic_operator(name, 6, 3)):
        for pname, p in op.named_parameters():
            if pname in expected:
                assert torch.all(p == expected[pname]), pname
            else:
                assert torch.equal(p.detach(), torch.eye(6).expand(p.shape)), pname


@pytest.mark.parametrize("name", NAMES)
def test_parameter_names_and_shapes_are_the_checkpoint_spec(name: str) -> None:
    static = {k: tuple(v.shape) for k, v in make_operator(name, 8).named_parameters()}
    dynamic = {k: tuple(v.shape) for k, v in make_dynamic_operator(name, 8, 5).named_parameters()}
    assert static == param_shapes(name, dimension=8, num_dynamic_rels=None)
    assert dynamic == param_shapes(name, dimension=8, num_dynamic_rels=5)


def test_complex_diagonal_rejects_odd_dimension() -> None:
    with pytest.raises(ValueError, match="even"):
        make_operator("complex_diagonal", 5)
    with pytest.raises(ValueError, match="even"):
        make_dynamic_operator("complex_diagonal", 5, 2)


def _config(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "entities": {"user": {"num_partitions": 1}, "item": {"num_partitions": 1, "dimension": 4}},
        "relations": [{"name": "buys", "lhs": "user", "rhs": "item", "operator": "affine"},
                      {"name": "likes", "lhs": "item", "rhs": "item", "operator": "complex_diagonal"},
                      {"name": "knows", "lhs": "user", "rhs": "user"}],
        "dimension": 4, "entity_path": "e", "edge_paths": ["p"], "checkpoint_path": "c",
    }
    base.update(overrides)
    return base


def _model_params_by_public_name(model: EmbeddingModel) -> dict[str, tuple[int, ...] | None]:
    out: dict[str, tuple[int, ...] | None] = {}
    for key, value in model.state_dict().items():
        public = private_to_public(key)
        assert public is not None, key
        out[public] = tuple(value.shape)
    return out


def test_static_model_state_dict_maps_to_checkpoint_names() -> None:
    config = parse_config(_config())
    model = EmbeddingModel.from_config(config)
    assert _model_params_by_public_name(model) == expected_model_params(config, None)
    assert "rhs_operators.0.linear_transformation" in model.state_dict()
    assert "global_embs.emb_item" in model.state_dict()


def test_dynamic_model_state_dict_maps_to_checkpoint_names() -> None:
    config = parse_config(_config(
        relations=[{"name": "all", "lhs": "item", "rhs": "item", "operator": "complex_diagonal"}],
        dynamic_relations=True, global_emb=False))
    model = EmbeddingModel.from_config(config, num_dynamic_rels=7)
    assert _model_params_by_public_name(model) == expected_model_params(config, 7)
    assert set(model.state_dict()) == {"lhs_operators.0.real", "lhs_operators.0.imag",
                                       "rhs_operators.0.real", "rhs_operators.0.imag"}


@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4)), seed=st.integers(0, 2**31 - 1))
def test_fused_kernels_pass_gradcheck(shape: tuple[int, int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rows, half = shape

    def rand(*s: int) -> Tensor:
        return torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)

    x = rand(rows, 2 * half)
    assert torch.autograd.gradcheck(complex_multiply, (x, rand(rows, half), rand(rows, half)))
    assert torch.autograd.gradcheck(complex_multiply, (x, rand(half), rand(half)))  # broadcast parameters
    assert torch.autograd.gradcheck(lambda a, b: modulus_cube_sum(a, b), (rand(rows, half), rand(rows, half)))
    assert torch.autograd.gradcheck(lambda a, b: modulus_cube_sum(a, b, per_row=True),
                                    (rand(rows, half), rand(rows, half)))


def test_modulus_cube_gradient_is_finite_at_zero() -> None:
    re = torch.zeros(3, requires_grad=True)
    im = torch.zeros(3, requires_grad=True)
    modulus_cube_sum(re, im).backward()
    assert re.grad is not None and torch.equal(re.grad, torch.zeros(3))
