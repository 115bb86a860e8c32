"""Adagrad over the relation parameters: :class:`RelationAdagrad`.

The original trains its model parameters (relation operators, global embeddings) with
``torch.optim.Adagrad`` and stores that optimizer's ``state_dict`` in every checkpoint. This class
is that optimizer's state and update without ``torch.optim.Optimizer`` underneath: the same state
(``state[param]`` holds ``step`` and ``sum``), the same ``param_groups`` hyperparameters and the
same ``state_dict`` (which the original loads and resumes), but a step of a handful of ``_foreach``
operations on every parameter with a gradient at once. ``torch.optim.Optimizer`` wraps each step in
profiler and hook layers, and building one imports ``torch._dynamo`` (about a second, at every
``pbgtrain fit``): neither is needed for a dense update of a few tensors.

The update, per parameter (torch's Adagrad, whose settings a loaded state may carry)::

    step += 1
    g = -grad if maximize else grad;  g += weight_decay · p
    sum += g²;  p += (-lr / (1 + (step - 1) · lr_decay) · g) / (√sum + eps)

>>> p = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
>>> opt = RelationAdagrad([p], lr=0.5, eps=1e-10)
>>> p.grad = torch.tensor([2.0, 0.0])
>>> opt.step()
>>> p.detach().tolist(), opt.state[p]["sum"].tolist(), float(opt.state[p]["step"])
([0.5, 1.0], [4.0, 0.0], 1.0)
>>> opt.state_dict()["param_groups"][0]["params"], sorted(opt.state_dict()["state"][0])
([0], ['step', 'sum'])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch

from pbgtrain.model.scalars import constant

DEFAULTS: dict[str, Any] = {"lr_decay": 0, "weight_decay": 0, "initial_accumulator_value": 0, "foreach": None,
                            "maximize": False, "differentiable": False, "fused": None}
"""torch's Adagrad hyperparameters besides ``lr`` and ``eps``, at its defaults (the original's)."""


def _group(params: list[torch.Tensor], lr: float, eps: float) -> dict[str, Any]:
    """A param group with its keys in torch's order (a pickled state dict is then byte for byte torch's)."""
    return {"params": params, "lr": lr, "lr_decay": 0, "eps": eps, "weight_decay": 0, "initial_accumulator_value": 0,
            "foreach": None, "maximize": False, "differentiable": False, "fused": None}


class ParameterOptimizer(Protocol):
    """What a training step asks of the relation parameters' optimizer: :class:`RelationAdagrad`,
    or any ``torch.optim.Optimizer``."""

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> object: ...


class RelationAdagrad:
    """Adagrad with ``torch.optim.Adagrad``'s state, hyperparameters and ``state_dict``.

    ``params``: tensors, or param groups (dicts with ``"params"`` and any hyperparameters).
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]], lr: float,
                 eps: float = 1e-10) -> None:
        given: list[Any] = list(params)
        groups: list[dict[str, Any]] = given if given and isinstance(given[0], dict) else [{"params": given}]
        self.param_groups: list[dict[str, Any]] = []
        for group in groups:
            made = _group(list(group["params"]), lr, eps)
            made.update((k, v) for k, v in group.items() if k != "params")
            self.param_groups.append(made)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p] = {"step": torch.tensor(0.0),
                                 "sum": torch.full_like(p, group["initial_accumulator_value"],
                                                        memory_format=torch.preserve_format)}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient (:meth:`count_steps`, then :meth:`update`)."""
        self.count_steps()
        self.update()

    def count_steps(self, params: Iterable[torch.Tensor] | None = None) -> None:
        """Add one to the step count of ``params`` (default: every parameter with a gradient). The
        counts live on the CPU, as torch keeps them: a step replayed on a GPU counts here, outside it."""
        chosen = [p for group in self.param_groups for p in group["params"] if p.grad is not None] \
            if params is None else params
        for p in chosen:  # 0-dim adds: _foreach_add_ would convert its number once per tensor
            step = self.state[p]["step"]
            step.add_(constant(1, step))

    @torch.no_grad()
    def update(self, lr: torch.Tensor | None = None) -> None:
        """The update of every parameter that has a gradient, on its device, without counting the
        step; ``lr`` (a 0-dim tensor on the parameters' device) replaces each group's rate (it needs
        ``lr_decay`` 0: a decayed rate reads the step count)."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads: list[torch.Tensor] | tuple[torch.Tensor, ...] = [p.grad for p in params]
            states = [self.state[p] for p in params]
            if group["maximize"]:
                grads = torch._foreach_neg(grads)
            if group["weight_decay"]:
                grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
            sums = [state["sum"] for state in states]
            torch._foreach_addcmul_(sums, grads, grads, value=1)
            std = torch._foreach_sqrt(sums)
            for s in std:
                s.add_(constant(group["eps"], s))
            if lr is not None and group["lr_decay"]:
                raise ValueError("a learning rate given as a tensor cannot decay with the step count "
                                 f"(lr_decay={group['lr_decay']})")
            if group["lr_decay"]:
                for p, g, s, state in zip(params, grads, std, states, strict=True):
                    rate = group["lr"] / (1 + (float(state["step"]) - 1) * group["lr_decay"])
                    _descend([p], [g], [s], rate)
            else:
                _descend(params, grads, std, group["lr"] if lr is None else lr)

    def state_dict(self) -> dict[str, Any]:
        """torch's format: parameters by their position over the groups, the state's tensors as held."""
        index = {id(p): i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}
        groups = [{**{k: v for k, v in group.items() if k != "params"},
                   "params": [index[id(p)] for p in group["params"]]} for group in self.param_groups]
        return {"state": {index[id(p)]: state for p, state in self.state.items()}, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load torch's format (as :meth:`state_dict` writes it, or an older torch's: a number for
        ``step``, hyperparameters missing). Each ``sum`` takes its parameter's dtype and device."""
        saved_groups = state_dict["param_groups"]
        saved_sizes = [len(g["params"]) for g in saved_groups]
        sizes = [len(g["params"]) for g in self.param_groups]
        if saved_sizes != sizes:
            raise ValueError(f"the loaded optimizer state has {saved_sizes} parameters per group, this "
                             f"optimizer {sizes}")
        position = {i: p for saved, group in zip(saved_groups, self.param_groups, strict=True)
                    for i, p in zip(saved["params"], group["params"], strict=True)}
        for i, saved_state in state_dict["state"].items():
            p = position[i]
            self.state[p] = {key: _state_value(key, value, p) for key, value in saved_state.items()}
        loaded = []
        for saved, group in zip(saved_groups, self.param_groups, strict=True):
            made = {k: group["params"] if k == "params" else v for k, v in saved.items()}  # the saved order, as torch
            for key, value in DEFAULTS.items():  # an older torch's state lacks some (torch adds them last)
                made.setdefault(key, value)
            loaded.append(made)
        self.param_groups = loaded


def _descend(params: list[torch.Tensor], grads: list[torch.Tensor] | tuple[torch.Tensor, ...],
             std: list[torch.Tensor] | tuple[torch.Tensor, ...], rate: float | torch.Tensor) -> None:
    """``p += (-rate · g) / std``: one formula whether ``rate`` is a number (an eager step) or a 0-dim
    tensor (a replayed one, refilled between replays): scale, divide, add, each rounded once in
    that order, which is the order of the CPU's fused ``addcdiv_`` (torch's Adagrad), so the two
    paths and torch agree bit for bit on a CPU. Two formulas end a few ulps apart, and a negative
    within a rounding error of its positive falls on the other side (exact ties are common when a
    negative is the positive's own entity)."""
    if isinstance(rate, torch.Tensor):  # a 0-dim tensor: torch's overload for it (mypy picks overloads per type)
        steps = torch._foreach_mul(grads, torch.neg(rate))
    else:
        steps = torch._foreach_mul(grads, -rate)
    torch._foreach_div_(steps, std)
    torch._foreach_add_(params, steps)


def _state_value(key: str, value: Any, param: torch.Tensor) -> Any:
    if key == "step":  # a float32 scalar on the CPU, as torch keeps it (older torch stored a number)
        return value.detach().clone().to(torch.float32) if isinstance(value, torch.Tensor) \
            else torch.tensor(float(value))
    if isinstance(value, torch.Tensor):
        return value.detach().to(dtype=param.dtype, device=param.device, copy=True)
    return value
