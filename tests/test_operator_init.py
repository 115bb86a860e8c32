"""``pbgtrain fit --operator-init random`` (``FitOptions.operator_init``, the default): a fresh run's
relation operators are drawn from ``init_scale · N(0, 1)``, seeded by the run's seed; a resumed run
keeps what its checkpoint holds; ``identity`` starts them as the original does; a wrong name is a
usage error.

The example layout (``pbgio example``) has the relations follows (translation) and likes
(diagonal). ``relation_lr=0`` keeps the operators as they started, so the first committed
version shows the initial values.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from pbgio.checkpoint import CheckpointDir
from pbgio.errors import UsageError
from pbgio.example import build_example
from pbgtrain.cli import app
from pbgtrain.config import load_run_config
from pbgtrain.model import EmbeddingModel, ModelSpec, RelationSpec
from pbgtrain.train import FitOptions, fit

FROZEN_OPERATORS = ["workers=1", "relation_lr=0", "num_epochs=1"]
OPERATOR_PARAMS = ("relations/0/operator/rhs/translation", "relations/1/operator/rhs/diagonal")


@pytest.fixture(scope="module")
def example_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example(tmp_path_factory.mktemp("example") / "layout", num_edges=500).parent


def _copy(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest)
    return dest / "config.json"


def _operators(config: Path, overrides: list[str], options: FitOptions) -> dict[str, np.ndarray]:
    fit(load_run_config(config, overrides), options)
    params = CheckpointDir(config.parent / "checkpoint").read_model().params
    return {name: params[name] for name in OPERATOR_PARAMS}


def test_identity_keeps_the_originals_operators_and_the_default_draws_them(example_template: Path,
                                                                           tmp_path: Path) -> None:
    ops = _operators(_copy(example_template, tmp_path / "a"), FROZEN_OPERATORS,
                     FitOptions(seed=1, operator_init="identity"))
    assert not ops["relations/0/operator/rhs/translation"].any()
    assert (ops["relations/1/operator/rhs/diagonal"] == 1).all()
    default = _operators(_copy(example_template, tmp_path / "b"), FROZEN_OPERATORS, FitOptions(seed=1))
    drawn = _operators(_copy(example_template, tmp_path / "c"), FROZEN_OPERATORS,
                       FitOptions(seed=1, operator_init="random"))
    assert all(np.array_equal(default[name], drawn[name]) for name in OPERATOR_PARAMS)
    assert np.abs(default["relations/1/operator/rhs/diagonal"]).max() < 0.01


def test_random_operators_are_drawn_at_init_scale_and_seeded(example_template: Path, tmp_path: Path) -> None:
    overrides = [*FROZEN_OPERATORS, "init_scale=0.01"]
    first = _operators(_copy(example_template, tmp_path / "a"), overrides, FitOptions(seed=1, operator_init="random"))
    again = _operators(_copy(example_template, tmp_path / "b"), overrides, FitOptions(seed=1, operator_init="random"))
    other = _operators(_copy(example_template, tmp_path / "c"), overrides, FitOptions(seed=2, operator_init="random"))
    values = np.concatenate([v.ravel() for v in first.values()])
    assert 0.005 < values.std() < 0.02 and abs(values.mean()) < 0.005
    assert all(np.array_equal(first[name], again[name]) for name in OPERATOR_PARAMS)
    assert not any(np.array_equal(first[name], other[name]) for name in OPERATOR_PARAMS)


def test_a_resumed_run_keeps_its_checkpoints_operators(example_template: Path, tmp_path: Path) -> None:
    config = _copy(example_template, tmp_path / "a")
    checkpoint = CheckpointDir(config.parent / "checkpoint")
    started = _operators(config, FROZEN_OPERATORS, FitOptions(seed=1))
    first_run = checkpoint.read_version()
    resumed = _operators(config, [*FROZEN_OPERATORS[:-1], "num_epochs=2"], FitOptions(seed=1, operator_init="random"))
    assert checkpoint.read_version() > first_run  # it trained on, from what the first run committed
    assert all(np.array_equal(started[name], resumed[name]) for name in OPERATOR_PARAMS)


def test_dynamic_operators_are_drawn_per_relation() -> None:
    spec = ModelSpec({"all": 8}, (RelationSpec("all_edges", "all", "all", operator="complex_diagonal"),),
                     num_dynamic_rels=3, comparator="dot", global_emb=False)
    model = EmbeddingModel(spec)
    model.draw_operators(1e-3, seed=7)
    twin = EmbeddingModel(spec)
    twin.draw_operators(1e-3, seed=7)
    for name, value in model.state_dict().items():
        assert value.shape == twin.state_dict()[name].shape and torch.equal(value, twin.state_dict()[name])
        assert 0 < value.abs().max() < 0.01, name
    lhs, rhs = model.dynamic_operators()
    assert not torch.equal(lhs.real, rhs.real) and not torch.equal(lhs.real[0], lhs.real[1])


def test_an_unknown_initialisation_is_a_usage_error(example_template: Path, tmp_path: Path) -> None:
    config = _copy(example_template, tmp_path / "a")
    done = CliRunner().invoke(app, ["fit", str(config), "--operator-init", "zeros", "--no-progress"])
    assert done.exit_code == 2, done.output
    assert "'zeros' is not one of 'identity', 'random'" in " ".join(done.output.replace("│", " ").split())  # Typer
    assert not (config.parent / "checkpoint").exists()  # refused before anything was written
    with pytest.raises(UsageError, match=r"Invalid value for '--operator-init': 'zeros' is not one of 'identity', "
                                         r"'random'\."):
        fit(load_run_config(config), FitOptions(operator_init="zeros"))


def test_the_cli_option_reaches_the_run(example_template: Path, tmp_path: Path) -> None:
    config = _copy(example_template, tmp_path / "a")
    args = ["fit", str(config), *(a for o in FROZEN_OPERATORS for a in ("-p", o)), "--operator-init", "identity",
            "--no-progress"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    diagonal = CheckpointDir(config.parent / "checkpoint").read_model().params["relations/1/operator/rhs/diagonal"]
    assert (diagonal == 1).all()
