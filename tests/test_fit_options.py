"""Every bad ``pbgtrain fit`` option is refused once, at the entry point
(``pbgtrain.training.fit_plan.resolve_fit``): the command line exits 2 with the same line that
``pbgtrain.train.fit`` raises as a ``UsageError``, before anything is written; a choice the
command line offers as an enum (``--precision``, ``--operator-init``) is refused by Typer itself,
in the words ``fit()`` uses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pbgio.errors import UsageError
from pbgio.example import build_example
from pbgtrain.config import load_run_config
from pbgtrain.train import FitOptions, ValidationOptions, fit
from tests.cli import pbgtrain

ROOT = Path(__file__).resolve().parents[1]

# (command-line arguments, the same options for fit(), a fragment of the one line both give)
CASES = [
    (["--device", "gpu9"], {"device": "gpu9"}, "--device: expected cpu, cuda or cuda:N, found 'gpu9'"),
    (["--device", "cuda:7"], {"device": "cuda:7"}, "--device cuda:7: "),
    (["--precision", "fp8"], {"precision": "fp8"},
     "Invalid value for '--precision': 'fp8' is not one of 'fp32', 'tf32', 'bf16', 'auto'."),
    (["--relation-prediction", "0.5"], {"relation_prediction": 0.5},
     "--relation-prediction: relation prediction needs dynamic_relations"),
    (["--relation-prediction", "-1"], {"relation_prediction": -1.0},
     "--relation-prediction: expected a weight ≥ 0, found -1"),
    (["--operator-init", "zeros"], {"operator_init": "zeros"},
     "Invalid value for '--operator-init': 'zeros' is not one of 'identity', 'random'."),
    (["--freeze", "nope"], {"frozen_types": frozenset({"nope"})}, "--freeze: unknown entity type 'nope'"),
    (["--step", "fused"], {"step": "fused"},
     "Invalid value for '--step': 'fused' is not one of 'auto', 'scores', 'attention'."),
    (["--step", "attention", "--compile"], {"step": "attention", "compile": True},
     "--compile: it compiles the score-matrix step's elementwise passes, which the attention step"),
    (["--max-minutes", "-1"], {"max_seconds": -60.0}, "--max-minutes: expected minutes ≥ 0, found -1"),
    (["--max-iterations", "0"], {"max_iterations": 0}, "--max-iterations: expected a number of iterations ≥ 1"),
    (["--partition-memory", "-2"], {"partition_memory": -2.0}, "--partition-memory: expected GiB ≥ 0, found -2"),
    (["--peer-timeout", "0"], {"peer_timeout": 0.0}, "--peer-timeout: expected seconds > 0, found 0"),
    (["--valid", "nowhere"], {"validation": ValidationOptions("nowhere")}, "--valid directory"),
    (["--valid", "edges/test", "--filter", "nowhere"], {"validation": ValidationOptions("edges/test", ("nowhere",))},
     "--filter directory"),
    (["--valid", "edges/test", "--eval-every", "0"], {"validation": ValidationOptions("edges/test", every=0)},
     "--eval-every: expected a number of epochs ≥ 1, found 0"),
    (["--valid", "edges/test", "--patience", "0"], {"validation": ValidationOptions("edges/test", patience=0)},
     "--patience: expected a number of evaluations ≥ 1, found 0"),
    (["--valid", "edges/test", "--lr-decay", "1.5"], {"validation": ValidationOptions("edges/test", lr_decay=1.5)},
     "--lr-decay: expected a factor between 0 and 1 (exclusive), found 1.5"),
    (["--valid", "edges/test", "--lr-patience", "0"],
     {"validation": ValidationOptions("edges/test", lr_patience=0)},
     "--lr-patience: expected a number of evaluations ≥ 1, found 0"),
]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example(tmp_path_factory.mktemp("options") / "example", num_edges=200)


def _line(text: str) -> str:
    """Output as one line: a Typer error panel's borders and wrapping removed (recent Typer versions
    also put "Value error, " before the message of a refused choice)."""
    return " ".join(text.replace("│", " ").replace("Value error, ", "").split())


@pytest.mark.parametrize(("args", "options", "fragment"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_bad_option_is_one_usage_error_from_the_cli_and_from_fit(example: Path, args: list[str],
                                                                   options: dict[str, object], fragment: str) -> None:
    with pytest.raises(UsageError) as raised:
        fit(load_run_config(example), FitOptions(**options))  # type: ignore[arg-type]
    message = str(raised.value)
    assert fragment in message, message
    done = pbgtrain("fit", str(example), *args, "--no-progress")
    assert done.returncode == 2, done.stdout + done.stderr
    assert _line(message) in _line(done.stdout + done.stderr)
    assert not (example.parent / "checkpoint").exists()  # refused before anything was written


def test_a_rank_outside_the_run_is_a_usage_error(example: Path) -> None:
    """``--rank`` is run in a process of its own: a distributed command leaves at once (``os._exit``)."""
    with pytest.raises(UsageError) as raised:
        fit(load_run_config(example), FitOptions(rank=3))
    assert str(raised.value) == "--rank 3: expected a rank in [0, 1) (num_machines=1 in the config)"
    done = subprocess.run([sys.executable, "-m", "pbgtrain", "fit", str(example), "--rank", "3", "--no-progress"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and str(raised.value) in _line(done.stderr), done.stderr


def test_companions_of_valid_without_it_are_refused_by_the_cli(example: Path) -> None:
    """Options that only the command line can give apart (fit() takes them inside ValidationOptions)."""
    for args in (["--patience", "2"], ["--filter", "edges/test"], ["--lr-decay", "0.5"]):
        done = pbgtrain("fit", str(example), *args)
        assert done.returncode == 2 and "go with --valid PATH" in done.stderr, done.stderr
