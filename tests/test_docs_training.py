"""The runnable examples of the training guide (docs/guides/training.md) run as written (see
tests/guide_runner.py). Its ``bash`` blocks are a command summary, not a session: not run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.guide_runner import block_kinds, run_guide

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "training.md"


def test_guide_blocks_are_found() -> None:
    kinds = block_kinds(GUIDE)
    assert kinds.count("console") >= 2 and kinds.count("python") >= 3


@pytest.mark.slow  # runs the guide's commands, which train: about 10 s
def test_training_guide_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_guide(GUIDE, tmp_path) > 12
