"""The default test run uses every core: the README's test command is ``.ci/run``'s first step, and
it runs pytest with a worker per core (pytest-xdist, a declared test dependency), the processes
its tests start computing on one thread (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with tomllib (Python 3.11+)")

REPO = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"Install and run the tests.*?```bash\n(.*?)\n```", readme, flags=re.DOTALL)
    assert found is not None, "README.md: no 'Install and run the tests' block"
    return found.group(1).strip()


def test_the_readme_test_command_is_ci_first_step_and_runs_a_worker_per_core() -> None:
    command = _readme_test_command()
    assert command in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    pytest_part = command.split("&&")[-1].split()
    assert pytest_part[:4] == [".venv/bin/python", "-m", "pytest", "-q"], pytest_part
    assert "-n" in pytest_part and pytest_part[pytest_part.index("-n") + 1] == "auto", pytest_part
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(re.match(r"pytest-xdist\b", requirement) for requirement in extras["test"]), extras["test"]


def test_a_worker_and_the_processes_its_tests_start_compute_on_one_thread() -> None:
    """In-process fits set their own thread count (``workers``); the processes tests start (the
    command lines) read ``OMP_NUM_THREADS`` when torch starts."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("runs in an xdist worker (the default run, -n auto); this run has none")
    assert os.environ["OMP_NUM_THREADS"] == "1"
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                          capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "1"
