"""Each option of ``pbgtrain fit`` is declared once, in ``FitOptions``: a ``FitPlan`` holds the
options as one field (``plan.options``) and declares only what ``resolve_fit`` derives from them
(a ``torch.device``, a precision, the operator initialisation, the step), never a copy of an
option field by field."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from pbgio.config import parse_config
from pbgio.example import example_config
from pbgio.layout import Layout
from pbgtrain.train import FitOptions, FitPlan, ValidationOptions, resolve_fit

OPTION_NAMES = {f.name for f in dataclasses.fields(FitOptions)}

VALIDATION = ValidationOptions("edges/valid", ("edges/valid", "edges/more"), every=2, patience=3, lr_decay=0.5,
                               lr_patience=2, sample=10)
# A value for every option, each other than its default and each accepted by resolve_fit (on a
# CPU, with a config of dynamic relations so that --relation-prediction can train).
GIVEN: dict[str, object] = {
    "device": "cpu",
    "seed": 7,
    "check_layout": False,
    "interactive": True,
    "max_seconds": 12.5,
    "max_iterations": 3,
    "rank": 1,
    "peer_timeout": 4.0,
    "precision": "tf32",
    "partition_memory": 1.5,
    "read_ahead_partitions": True,
    "compile": True,
    "static_shapes": True,
    "step": "scores",
    "capture": False,
    "remote_cache": 2.0,
    "frozen_types": frozenset({"item"}),
    "validation": VALIDATION,
    "operator_init": "identity",
    "relation_prediction": 0.25,
}


def test_an_option_is_not_declared_again_in_the_plan() -> None:
    """A field of the plan named as an option holds what resolve_fit derives from it, of another
    type (``device``: a ``torch.device``); the option's value itself is read from ``plan.options``."""
    plan_fields = {f.name: f for f in dataclasses.fields(FitPlan)}
    plan_types, option_types = typing.get_type_hints(FitPlan), typing.get_type_hints(FitOptions)
    assert plan_types["options"] is FitOptions
    copied = sorted(name for name in OPTION_NAMES & set(plan_fields) if plan_types[name] == option_types[name])
    assert not copied, f"FitPlan declares again the options {copied}: read them from plan.options"


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    """The example's config with two machines and dynamic relations; the validation folders exist."""
    for folder in ("edges/valid", "edges/more"):
        (tmp_path / folder).mkdir(parents=True)
    cfg = example_config().to_dict()
    cfg.update(num_machines=2, dynamic_relations=True, global_emb=False,
               relations=[{"name": "all", "lhs": "user", "rhs": "item", "operator": "diagonal"}])
    return Layout.load(parse_config(cfg, "test"), base=tmp_path)


def test_resolve_fit_keeps_every_option(layout: Layout) -> None:
    assert set(GIVEN) == OPTION_NAMES, "a new option: give it a value here"
    defaults = FitOptions()
    assert [n for n in OPTION_NAMES if getattr(defaults, n) == GIVEN[n]] == []  # each value tells
    options = FitOptions(**GIVEN)  # type: ignore[arg-type]
    plan = resolve_fit(layout, options)
    base = layout.base
    assert isinstance(base, Path)
    # the same options; only the validation paths are made absolute
    absolute = dataclasses.replace(VALIDATION, edge_path=str(base / "edges/valid"),
                                   filter_paths=(str(base / "edges/valid"), str(base / "edges/more")))
    assert plan.options == dataclasses.replace(options, validation=absolute)
    assert (str(plan.device), plan.precision, plan.operator_init.value) == ("cpu", "tf32", "identity")
    assert plan.step.head == "scores" and plan.step.compiled and plan.step.capture == "none"


def test_resolve_fit_keeps_the_defaults(layout: Layout) -> None:
    assert resolve_fit(layout, FitOptions()).options == FitOptions()


def test_the_frozen_types_of_a_plan_are_a_frozenset(layout: Layout) -> None:
    """A Python caller may give a set; the plan holds a frozenset of the same types."""
    plan = resolve_fit(layout, FitOptions(frozen_types={"item"}))  # type: ignore[arg-type]
    assert type(plan.options.frozen_types) is frozenset and plan.options.frozen_types == {"item"}
