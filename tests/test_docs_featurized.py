"""The featurized walkthrough (docs/guides/featurized.md) runs as written (see tests/guide_runner.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.guide_runner import block_kinds, run_guide

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "featurized.md"


def test_walkthrough_blocks_are_found() -> None:
    kinds = block_kinds(GUIDE)
    assert kinds.count("console") >= 4 and kinds.count("python") >= 1


@pytest.mark.slow  # runs the guide's commands, which train: about 15 s
def test_featurized_walkthrough_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_guide(GUIDE, tmp_path) > 15
