"""tools/kill_harness.py: a short run per target finds no failure, and it does find a real one.

The long runs (200 kills of ``pbgtrain fit``, 50 of import and convert) and their figures are in
docs/guides/crash-safety.md.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kill_harness", ROOT / "tools" / "kill_harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


kh = _harness()

WRITER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    dst = Path(sys.argv[1])
    atomic = sys.argv[2] == "atomic"
    out = dst.with_name("." + dst.name + ".partial") if atomic else dst
    if atomic and out.exists():
        for p in out.iterdir():
            p.unlink()
    out.mkdir(exist_ok=True)
    with open(out / "data.bin", "wb") as f:
        for i in range(40):
            f.write(bytes([i]) * 4096)
            f.flush()
            time.sleep(0.02)
    if atomic:
        os.rename(out, dst)
""")


def _writer(tmp_path: Path, mode: str) -> str:
    script = tmp_path / "writer.py"
    script.write_text(WRITER, encoding="utf-8")
    return f"{sys.executable} {script} {{dst}} {mode}"


def test_a_writer_that_leaves_half_a_file_under_its_final_name_is_reported(tmp_path: Path) -> None:
    target = kh.CommandTarget(_writer(tmp_path, "in-place"))
    summary = kh.run_harness(target, 4, seed=3, chain=2, workdir=tmp_path / "work")
    assert summary.deterministic
    assert summary.failures, summary.text()
    problems = [p for f in summary.failures for p in f["problems"]]
    assert any("DST exists but differs data.bin" in p for p in problems), problems
    assert all(Path(f["directory"]).is_dir() for f in summary.failures)  # kept for inspection
    assert "failures: " in summary.text() and "kept under" in summary.text()


@pytest.mark.slow  # kills a writer process 4 times: about 5 s (the harness's detection stays in the default run)
def test_the_same_writer_made_atomic_passes(tmp_path: Path) -> None:
    target = kh.CommandTarget(_writer(tmp_path, "atomic"))
    summary = kh.run_harness(target, 4, seed=3, chain=2, workdir=tmp_path / "work")
    assert not summary.failures, summary.text()
    assert len(summary.kills) == 4
    assert {k.state for k in summary.kills} <= {"absent", "complete"}


def test_compare_trees_reads_stats_and_hdf5_by_content(tmp_path: Path) -> None:
    import h5py
    import numpy as np

    a, b = tmp_path / "a", tmp_path / "b"
    for root, lines in ((a, ['{"index": 0, "pbgtrain": {"trained_from": 1}}']),
                        (b, ['{"index": 0, "pbgtrain": {"trained_from": 9}}', '{"index": 0, "pbgtrain": {}}'])):
        root.mkdir()
        (root / "training_stats.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
        with h5py.File(root / "x.h5", "w", libver="latest" if root == b else "earliest") as f:
            f.create_dataset("d", data=np.arange(4))
    result = kh.compare_trees(a, b)
    assert result.problems == [] and result.h5_by_content == 1
    (b / ".x.h5.tmp").write_bytes(b"")
    assert kh.compare_trees(a, b).problems == ["extra .x.h5.tmp"]


@pytest.mark.slow
@pytest.mark.parametrize(("target", "kills"), [
    ("fit", 4),
    ("import", 3),
    ("append", 4),
    ("convert", 3),
])
def test_short_run_finds_no_failure(tmp_path: Path, target: str, kills: int) -> None:
    """One trial per target: ``kills`` kills in one directory, then the resume. (The two
    uninterrupted runs that check determinism are the long run's; here one reference run.)"""
    made = {"fit": kh.FitTarget, "import": lambda: kh.ImportTarget(edges=40_000),
            "append": lambda: kh.AppendTarget(edges=40_000),
            "convert": lambda: kh.ConvertTarget(edges_per_bucket=10_000)}[target]()
    summary = kh.run_harness(made, kills, seed=7, chain=kills, workdir=tmp_path / "work", twice=False)
    assert not summary.failures, summary.text()
    assert len(summary.kills) + summary.completed_before_kill >= 1


@pytest.mark.distributed
@pytest.mark.slow
def test_distributed_kills_and_a_stall_find_no_failure(tmp_path: Path) -> None:
    """3 trainers: 3 SIGKILLs of a random rank and 1 SIGSTOP/SIGCONT; the survivors stop in time with
    one error line naming the lost rank, the committed version validates, and the rerun finishes.
    About 2 minutes on 2 cores; the long run's figures are in docs/guides/crash-safety.md."""
    sys.path.insert(0, str(ROOT / "tools"))
    from kill_distributed import run_distributed

    summary = run_distributed(3, 1, seed=2, workdir=tmp_path / "work")
    assert not summary.failures, summary.text()
    assert [h.mode for h in summary.hits] == ["kill", "kill", "kill", "stall"]
    assert all(h.stopped_after is not None for h in summary.hits)


def test_distributed_phase_is_judged_from_the_commit_files() -> None:
    """A partition written into the version being built is training; the next version's model (or
    its temporary file), the config's or version file's temporary file, or a superseded version's
    file is a commit; version 9 committed is finishing."""
    sys.path.insert(0, str(ROOT / "tools"))
    from kill_distributed import committing_at_least, phase_of

    v3 = {"checkpoint_version.txt", "model.v3.h5", "embeddings_node_0.v3.h5", "config.json"}
    assert phase_of(v3 | {".embeddings_node_1.v4.h5.tmp", "embeddings_node_0.v4.h5"}, 3) == "training"
    for name in (".model.v4.h5.tmp", "model.v4.h5", ".config.json.tmp", ".checkpoint_version.txt.tmp"):
        assert phase_of(v3 | {name}, 3) == "commit", name
    assert phase_of(v3 | {"embeddings_node_0.v2.h5"}, 3) == "commit"  # v2 not removed yet
    assert phase_of(v3, None) == "commit"
    assert phase_of({"checkpoint_version.txt", "model.v9.h5"}, 9) == "finishing"
    assert committing_at_least(v3 | {".model.v4.h5.tmp"}, 3, 4)
    assert not committing_at_least(v3 | {".model.v4.h5.tmp"}, 3, 5)


@pytest.mark.distributed
@pytest.mark.slow
def test_distributed_kills_on_s3_find_no_failure(tmp_path: Path) -> None:
    """The layout on ``s3://`` (moto's server, started by the harness): 2 SIGKILLs, one of them
    (seed 0) sent by the server as a commit's write request comes in; the committed version on the
    store validates, the rerun finishes, its final checkpoint is downloaded and kept, and, where
    ``PBG_ORIGINAL_VENV`` names the original's environment, the original loads it."""
    pytest.importorskip("moto.server")
    sys.path.insert(0, str(ROOT / "tools"))
    from kill_distributed import run_distributed

    venv = os.environ.get("PBG_ORIGINAL_VENV")
    summary = run_distributed(2, 0, seed=0, workdir=tmp_path / "work", storage="s3",
                              original_venv=Path(venv) if venv else None)
    assert not summary.failures, summary.text()
    assert [h.mode for h in summary.hits] == ["kill", "kill"]
    assert summary.figures()["storage"] == "s3"
    assert "commit" in {h.phase for h in summary.hits}, summary.text()
    for trial in summary.kept:
        kept = tmp_path / "work" / "finals" / f"trial{trial:04d}"
        assert (kept / "checkpoint" / "model.v9.h5").is_file() and (kept / "config.json").is_file()
    if venv:
        assert summary.original_loaded == summary.original_checked == len(summary.kept)
