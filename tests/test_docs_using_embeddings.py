"""The guide to trained embeddings (docs/guides/using-embeddings.md) runs as written (see
tests/guide_runner.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.guide_runner import block_kinds, run_guide

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "using-embeddings.md"


def test_guide_blocks_are_found() -> None:
    kinds = block_kinds(GUIDE)
    assert kinds.count("console") >= 6 and kinds.count("python") >= 3


@pytest.mark.slow  # trains the example, appends to a copy and warm-starts it; starts pbgtrain ten times: 30-60 s
def test_using_embeddings_guide_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_guide(GUIDE, tmp_path) > 20
