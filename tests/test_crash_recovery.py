"""Regressions found by tools/kill_harness.py: what a ``kill -9`` leaves, the next run cleans up.

- ``pbgio import`` killed before its commit left its hidden staging directories behind for good;
  killed while moving files into place it left part of a layout that made the same command
  refuse (``LayoutExistsError``) until ``--overwrite``. Ctrl-C in the same place did too.
- ``pbgtrain fit`` killed after its last commit point but before it removed the previous
  version left that version's files behind for good (a rerun had nothing to train, so it never
  reached the removal).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.importers import import_edge_lists
from pbgio.importers.write import COMMIT_MARKER, STAGING_PREFIX, remove_stale_staging
from pbgio.validate import validate_path
from tests.test_import_errors import write_config

EDGES = "".join(f"u{i}\tfollows\tu{(i * 7) % 50}\nu{i}\tlikes\tu{(i * 3) % 40}\n" for i in range(200))

# Runs the import in a child and SIGKILLs the child at the chosen moment of the commit: when it
# first moves a file of the given kind into place ("edges", "entity_count"), or before the commit.
KILLED_IMPORT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from pbgio.importers import import_edge_lists, write
    config, data, moment = sys.argv[1], sys.argv[2], sys.argv[3]
    real_replace = os.replace
    def replace(src, dst):
        if Path(dst).name.startswith(moment) and not Path(dst).parent.name.startswith(".pbgio-import"):
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)
    write.os.replace = replace
    if moment == "before-commit":
        write.Staging.commit = lambda self: os.kill(os.getpid(), signal.SIGKILL)
    import_edge_lists(config, [data])
""")


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def clean_import(tmp_path: Path) -> dict[str, str]:
    """The layout files of an import that nobody interrupted."""
    root = tmp_path / "clean"
    root.mkdir()
    (root / "t.tsv").write_text(EDGES, encoding="utf-8")
    import_edge_lists(write_config(root), [root / "t.tsv"])
    return _tree(root / "data")


def _killed_import(root: Path, moment: str) -> Path:
    root.mkdir()
    (root / "t.tsv").write_text(EDGES, encoding="utf-8")
    config = write_config(root)
    done = subprocess.run([sys.executable, "-c", KILLED_IMPORT, str(config), str(root / "t.tsv"), moment],
                          capture_output=True, text=True, check=False, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert done.returncode == -signal.SIGKILL, done.stderr
    return config


@pytest.mark.parametrize("moment", ["before-commit", "edges", "entity_count"])
def test_rerun_after_a_killed_import_gives_the_clean_layout(tmp_path: Path, clean_import: dict[str, str],
                                                            moment: str) -> None:
    config = _killed_import(tmp_path / "killed", moment)
    data = config.parent / "data"
    leftovers = sorted(p.name for p in data.rglob(f"{STAGING_PREFIX}*"))
    assert leftovers  # what the kill left: its staging directories
    marker = [p for p in data.rglob(COMMIT_MARKER)]
    assert bool(marker) == (moment != "before-commit")  # the commit had started
    report = validate_path(config)
    assert not report.ok  # never visible as a complete layout
    import_edge_lists(config, [config.parent / "t.tsv"])  # the same import again, no --overwrite
    assert _tree(data) == clean_import  # no staging directory left, the same files
    assert validate_path(config).ok


def test_ctrl_c_while_moving_files_in_removes_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   clean_import: dict[str, str]) -> None:
    from pbgio.importers import write

    config = write_config(tmp_path)
    (tmp_path / "t.tsv").write_text(EDGES, encoding="utf-8")
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst).name.startswith("entity_count") and not Path(dst).parent.name.startswith(STAGING_PREFIX):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(write.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        import_edge_lists(config, [tmp_path / "t.tsv"])
    monkeypatch.setattr(write.os, "replace", real_replace)
    assert not validate_path(config).ok
    assert not [p for p in (tmp_path / "data").rglob("*.h5")]  # the buckets already moved in are gone again
    import_edge_lists(config, [tmp_path / "t.tsv"])
    assert _tree(tmp_path / "data") == clean_import


def test_a_live_import_s_staging_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "data"
    mine = target / f"{STAGING_PREFIX}{os.getpid()}-0123abcd"
    mine.mkdir(parents=True)
    (mine / COMMIT_MARKER).write_bytes(b"")
    (target / "entity_count_user_0.txt").write_text("3\n", encoding="utf-8")
    assert remove_stale_staging([target]) == []
    assert mine.is_dir() and (target / "entity_count_user_0.txt").is_file()


def test_fit_rerun_removes_the_version_a_kill_after_the_last_commit_left(tmp_path: Path) -> None:
    from pbgio.example import build_example
    from pbgtrain.config import load_run_config
    from pbgtrain.train import FitOptions, fit

    config = build_example(tmp_path / "layout", num_edges=600)
    overrides = ["num_epochs=2", "workers=1"]
    ckpt = CheckpointDir(config.parent / "checkpoint")
    fit(load_run_config(config, overrides), FitOptions(seed=1, max_iterations=1))
    kept = tmp_path / "v1"
    kept.mkdir()
    for path in ckpt.files_of_version(1):
        shutil.copy2(path, kept / path.name)
    fit(load_run_config(config, overrides), FitOptions(seed=1))
    assert ckpt.read_version() == 2 and ckpt.versions_on_disk() == [2]
    for path in kept.iterdir():  # the state of a kill between committing v2 and removing v1
        shutil.copy2(path, ckpt.path / path.name)
    assert "checkpoint-stale-files" in validate_path(config).rule_ids()
    result = fit(load_run_config(config, overrides), FitOptions(seed=1))
    assert result.iterations == []  # nothing left to train
    assert ckpt.versions_on_disk() == [2]
    report = validate_path(config)
    assert report.ok and "checkpoint-stale-files" not in report.rule_ids(), [str(i) for i in report.issues]
