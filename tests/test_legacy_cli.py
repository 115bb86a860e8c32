"""``pbgio convert --from legacy``: exit codes, dry runs, DST safety, and interrupted conversions."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pbgio.cli.converting import convert
from pbgio.testing.legacy_layouts import LegacySpec, write_legacy_layout
from pbgio.validate import validate_path
from tests.cli import pbgio

CONVERT = (
    "import sys\n"
    "from pbgio.cli.commands import app\n"
    "from pbgio.cli.converting import convert\n"
    "if not any(c.callback is convert for c in app.registered_commands):\n"
    "    app.command()(convert)\n"
    "app(['convert', *sys.argv[1:]])\n"
)


def convert_args(*args: str) -> list[str]:
    return [sys.executable, "-c", CONVERT, *args]


_APP = typer.Typer()
_APP.command()(convert)


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in this process (fast; torch is imported once)."""
    result = CliRunner().invoke(_APP, list(args))
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def legacy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("small") / "legacy"
    write_legacy_layout(root, LegacySpec(seed=21))
    return root


def test_converts_and_result_validates(legacy: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    done = pbgio("convert", "--from", "legacy", str(legacy), str(dst))  # registered on the real app
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "converted" in done.stderr and "placeholder" in done.stderr  # the phantom-row warning
    assert pbgio("validate", str(dst)).returncode == 0


def test_dry_run_writes_nothing(legacy: Path, tmp_path: Path) -> None:
    before = sorted(tmp_path.iterdir())
    src_before = tree_digest(legacy)
    done = invoke("--from", "legacy", str(legacy), str(tmp_path / "out"), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "index base: 1-based" in done.stdout and "camelCase" in done.stdout
    assert "data/train_partitioned/edges_0_0.h5  ← data/train_partitioned/edges_1_1.h5" in done.stdout
    assert "metric → comparator" in done.stdout and "all_rhs_negs → relations[0].all_negs" in done.stdout
    assert "placeholder" in done.stdout and "nothing written" in done.stderr
    assert sorted(tmp_path.iterdir()) == before  # no DST, no staging directory
    assert tree_digest(legacy) == src_before
    as_json = invoke("--from", "legacy", str(legacy), str(tmp_path / "out"), "--dry-run", "--json")
    plan = json.loads(as_json.stdout)
    assert plan["written"] is False and plan["steps"] and plan["variant"]["config_era"] == "camelCase"
    assert sorted(tmp_path.iterdir()) == before


def test_non_empty_dst_needs_force(legacy: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "precious.txt").write_text("keep me")
    done = invoke("--from", "legacy", str(legacy), str(dst))
    assert done.returncode == 2
    assert "not empty" in done.stderr and "--force" in done.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["precious.txt"]
    done = invoke("--from", "legacy", str(legacy), str(dst), "--force")
    assert done.returncode == 0, done.stderr
    assert not (dst / "precious.txt").exists() and validate_path(dst).ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left beside it


def test_empty_dst_is_fine(legacy: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    assert invoke("--from", "legacy", str(legacy), str(tmp_path / "out")).returncode == 0


def test_usage_errors(legacy: Path, tmp_path: Path) -> None:
    assert invoke("--from", "legacy", str(tmp_path / "missing"), str(tmp_path / "out")).returncode == 2
    inside = invoke("--from", "legacy", str(legacy), str(legacy / "migrated"))
    assert inside.returncode == 2 and "never written" in inside.stderr
    assert not (legacy / "migrated").exists()
    assert invoke(str(legacy), str(tmp_path / "out")).returncode == 2  # --from is required
    assert invoke("--from", "hdfs", str(legacy), str(tmp_path / "out")).returncode == 2
    (tmp_path / "empty").mkdir()
    nothing = invoke("--from", "legacy", str(tmp_path / "empty"), str(tmp_path / "out"))
    assert nothing.returncode == 1 and "legacy-not-found" in nothing.stderr
    assert not (tmp_path / "out").exists()


def test_validate_on_legacy_names_convert(legacy: Path) -> None:
    report = validate_path(legacy)
    assert report.kind == "legacy" and report.rule_ids() == {"legacy-layout"}
    assert "pbgio convert --from legacy" in report.issues[0].message


# --------------------------------------------------------------------------- interruptions


@pytest.fixture(scope="module")
def big_legacy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """16 buckets of 250,000 edges (about 100 MB): converting takes long enough to interrupt."""
    root = tmp_path_factory.mktemp("big") / "legacy"
    write_legacy_layout(root, LegacySpec(seed=7, num_partitions=4, num_users=400, edges_per_bucket=250_000))
    return root, tree_digest(root)


def start_and_wait_for_buckets(src: Path, dst: Path, buckets: int) -> tuple[subprocess.Popen[str], Path]:
    # A shell's background job inherits SIGINT ignored, and Python then keeps ignoring it: restore it.
    proc = subprocess.Popen(convert_args("--from", "legacy", str(src), str(dst), "--no-progress"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        staging = sorted(dst.parent.glob(f".{dst.name}.pbgio-convert.*.tmp"))
        if staging and len(list(staging[0].rglob("edges_*.h5"))) >= buckets:
            return proc, staging[0]
        assert proc.poll() is None, f"the conversion ended before the interruption: {proc.communicate()}"
        time.sleep(0.002)
    proc.kill()
    raise AssertionError("the conversion never started writing buckets")


@pytest.mark.parametrize("buckets", [1, pytest.param(8, marks=pytest.mark.slow)])  # 8: a second kill, later
def test_killed_conversion_leaves_no_valid_dst(big_legacy: tuple[Path, dict[str, str]], tmp_path: Path,
                                               buckets: int) -> None:
    src, digest = big_legacy
    dst = tmp_path / "out"
    proc, staging = start_and_wait_for_buckets(src, dst, buckets)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not dst.exists()  # DST appears only by the final rename
    assert staging.exists()  # what a kill leaves: the hidden staging directory, which is incomplete
    leftover = validate_path(staging)
    assert not leftover.ok and "edge-file-missing" in leftover.rule_ids()
    assert tree_digest(src) == digest  # SRC untouched
    done = invoke("--from", "legacy", str(src), str(dst))  # a new run removes the leftover
    assert done.returncode == 0, done.stderr
    assert not staging.exists() and validate_path(dst).ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_ctrl_c_removes_everything(big_legacy: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    src, digest = big_legacy
    dst = tmp_path / "out"
    proc, staging = start_and_wait_for_buckets(src, dst, 1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert not dst.exists() and not staging.exists()
    assert list(tmp_path.iterdir()) == []
    assert tree_digest(src) == digest
