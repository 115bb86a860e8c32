"""The import/export guide runs: every example in docs/guides/import-export.md is a doctest."""

from __future__ import annotations

import doctest
import re
import shutil
from pathlib import Path

import pytest

from pbgio.checkpoint import CheckpointDir
from tests.guide_runner import console_blocks, run_command, sessions
from tests.shared import shared_path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "import-export.md"


def test_import_export_guide_runs() -> None:
    result = doctest.testfile(str(GUIDE), module_relative=False,
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 25
    assert result.failed == 0


@pytest.mark.slow  # imports FB15k-237 and trains two epochs: about a minute
def test_quick_start_trains_on_the_training_split_and_evaluates_what_it_never_saw(tmp_path: Path) -> None:
    """The quick start's commands, as written, on the real archive: the config it shows lists all
    three splits (one import, one dictionary), yet what ``fit`` trains on is the training split
    only, and what ``eval`` measures is a split the model never saw (and no warning says otherwise)."""
    shutil.copy(shared_path("datasets", "fb15k-237.tar.gz"), tmp_path)
    blocks = console_blocks(GUIDE)
    first = next(i for i, body in enumerate(blocks) if "tar -xzf fb15k-237.tar.gz" in body)
    quick_start = blocks[first] + blocks[first + 1]  # unpack, import, validate; then train and evaluate
    outputs = []
    for command, want in sessions(quick_start):
        if command == "cat fb/config.json":  # the reader writes the config the guide shows
            (tmp_path / "fb" / "config.json").write_text(want, encoding="utf-8")
        outputs.append(run_command(command, want, tmp_path))
    for output in outputs:
        assert "named like a held-out split" not in output and "the model trained on these edges" not in output
    trained = CheckpointDir(tmp_path / "fb" / "model").read_config().edge_paths
    assert trained == ["data/train"]
    evaluated = re.search(r"--edges (\S+)", _command(quick_start, "eval"))
    assert evaluated is not None and evaluated.group(1) == "data/test"  # relative to the config's folder
    assert "data/test" not in trained


def _command(block: str, name: str) -> str:
    return next(command for command, _ in sessions(block) if command.startswith(f"pbgtrain {name} "))
