"""The pbgio command line: exit codes, streams, and a fast start without torch.

The real entry point (``python -m pbgio``, a new process) gives each exit code once; the other
cases run the same app in this process (tests/cli.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from pbgio.example import build_example
from tests.cli import pbgio


def pbgio_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m pbgio ARGS`` in a new process."""
    return subprocess.run([sys.executable, "-m", "pbgio", *args], capture_output=True, text=True,
                          check=False)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example(tmp_path_factory.mktemp("example"), num_edges=400)


def test_valid_layout_exits_zero(example: Path) -> None:
    done = pbgio_process("validate", str(example))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # human text goes to stderr
    assert "valid" in done.stderr


def test_invalid_layout_exits_one_and_reports_all(example: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(example.parent, broken)
    with h5py.File(broken / "edges/train/edges_1_1.h5", "r+") as f:
        f["rel"][0] = 7
        f["lhs"][1] = 1000
    (broken / "entities/entity_count_item_0.txt").write_text("forty\n")
    done = pbgio_process("validate", str(broken / "config.json"), "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["valid"] is False
    rules = {i["rule"] for i in report["issues"]}
    assert {"edge-rel-range", "edge-lhs-range", "entity-count-format"} <= rules
    rel = next(i for i in report["issues"] if i["rule"] == "edge-rel-range")
    assert rel["file"] == "edges/train/edges_1_1.h5" and rel["dataset"] == "rel" and rel["rows"] == [0]


def test_usage_errors_exit_two(tmp_path: Path) -> None:
    assert pbgio_process("validate", str(tmp_path / "missing")).returncode == 2
    assert pbgio("validate").returncode == 2
    assert pbgio("validate", "--no-such-flag", str(tmp_path)).returncode == 2
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "file").write_text("occupied")
    assert pbgio("example", str(tmp_path / "x")).returncode == 2


def test_corrupt_file_is_an_error_not_a_traceback(example: Path, tmp_path: Path) -> None:
    bucket = tmp_path / "edges_0_0.h5"
    data = (example.parent / "edges/train/edges_0_0.h5").read_bytes()
    bucket.write_bytes(data[: len(data) // 2])
    done = pbgio("validate", str(bucket))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "truncated" in done.stderr and "[h5-unreadable]" in done.stderr


def test_info_summarizes(example: Path) -> None:
    done = pbgio("info", str(example), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["entities"]["user"]["counts"] == [30, 30]
    assert summary["edge_paths"][0]["total_edges"] == 400
    human = pbgio("info", str(example))
    assert "follows" in human.stdout and "0_1" in human.stdout


def test_info_names_dynamic_relations_and_the_best_version(tmp_path: Path) -> None:
    """Dynamic relations: their names (the first ten, then how many more and how to list them all);
    a checkpoint with ``best/`` (``fit --valid``): the version kept there."""
    from pbgio.entities import write_relation_names
    from pbgio.spec import naming

    config = build_example(tmp_path / "ex", num_edges=200)
    raw = json.loads(config.read_text())
    raw.update(dynamic_relations=True, global_emb=False,
               relations=[{"name": "all", "lhs": "user", "rhs": "user", "operator": "diagonal"}])
    config.write_text(json.dumps(raw))
    entities = config.parent / raw["entity_path"]
    names = [f"rel{i:02d}" for i in range(12)]
    write_relation_names(entities, names)
    (entities / naming.DYNAMIC_REL_COUNT).write_text("12\n")
    best = config.parent / raw["checkpoint_path"] / naming.BEST_DIR
    best.mkdir(parents=True)
    (best / naming.CHECKPOINT_VERSION).write_text("7\n")
    summary = json.loads(pbgio("info", str(config), "--json").stdout)
    assert summary["dynamic_rel_names"] == names and summary["checkpoint"]["best_version"] == 7
    human = " ".join(pbgio("info", str(config)).stdout.split())
    assert "dynamic relation types: 12: rel00, rel01, rel02, rel03, rel04, rel05, rel06, rel07, rel08, rel09, … " \
           f"(2 more: pbgio names {config} --relations, or pbgio info --json)" in human, human
    assert "best on validation: version 7 (best/)" in human, human


def test_version() -> None:
    done = pbgio_process("--version")
    assert done.returncode == 0 and done.stdout.startswith("pbgio ")


def test_validate_does_not_import_torch(example: Path) -> None:
    code = (
        "import sys\n"
        "from pbgio.cli.commands import app\n"
        "from pbgio.validate import validate_path\n"
        f"assert validate_path({str(example)!r}).ok\n"
        "assert 'torch' not in sys.modules, 'validation must not import torch'\n"
        "assert 'polars' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
