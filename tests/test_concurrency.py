"""Concurrent use of a checkpoint directory (docs/guides/concurrency.md).

One writer at a time: a second ``pbgtrain fit`` is refused at once, naming the holder, and a
holder killed with ``kill -9`` leaves nothing that blocks the next run. Readers (``pbgio
validate``, ``export``, ``pbgtrain eval``) running while ``fit`` commits version after version
always see one complete version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from pbgio.checkpoint import CheckpointDir, read_committed
from pbgio.console import EXIT_USAGE
from pbgio.edges import bucket_length
from pbgio.errors import CheckpointInUseError
from pbgio.example import TEST_EDGE_PATH, build_example
from pbgio.exporters import export_embeddings
from pbgio.spec import naming
from pbgio.storage.lock import CheckpointLock, holder_of
from pbgio.validate import validate_path
from pbgtrain.config import load_run_config
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
from pbgtrain.train import FitOptions, fit
from tests.cli import pbgtrain

TINY = {"dimension": 4, "batch_size": 50, "num_batch_negs": 10, "num_uniform_negs": 10, "workers": 1}


def _layout(tmp_path: Path, num_edges: int, **changes: int) -> Path:
    """The example layout, its config.json made tiny (and changed): every tool reads the same config."""
    config = build_example(tmp_path / "layout", num_edges=num_edges)
    data = json.loads(config.read_text())
    data.update(TINY, **changes)
    config.write_text(json.dumps(data))
    return config


def _fit_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "pbgtrain", "fit", str(config), "--no-progress"]


def _start_holder(config: Path, min_version: int = 1) -> subprocess.Popen[bytes]:
    """A ``pbgtrain fit`` subprocess, once it has committed ``min_version``."""
    ckpt = CheckpointDir(config.parent / "checkpoint")
    proc = subprocess.Popen(_fit_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while ckpt.read_version() < min_version and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.fail(f"the holder ended early: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    return proc


def test_lock_refuses_a_second_writer_and_a_released_lock_leaves_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    with CheckpointLock(directory, command="pbgtrain fit"):
        with pytest.raises(CheckpointInUseError) as refused:
            CheckpointLock(directory, command="another").acquire()
        assert f"in use by pbgtrain fit (pid {os.getpid()} on host" in str(refused.value)
        holder = json.loads((directory / naming.CHECKPOINT_LOCK).read_text())
        assert holder["pid"] == os.getpid() and holder["command"] == "pbgtrain fit"
    assert not directory.exists()  # created for the lock alone, and removed with it
    with CheckpointLock(directory):  # free again
        pass


def test_second_fit_is_refused_at_once_naming_the_holder(tmp_path: Path) -> None:
    config = _layout(tmp_path, 1000, num_epochs=400)
    holder = _start_holder(config)
    try:
        # In-process: the refusal comes within the lock's short wait, before anything is read.
        with pytest.raises(CheckpointInUseError) as refused:
            fit(load_run_config(config), FitOptions())
        assert f"in use by pbgtrain fit (pid {holder.pid} on host" in str(refused.value)
        # The command line (in this process: the holder is another one): a usage error (exit 2), the
        # holder named on stderr.
        second = pbgtrain("fit", str(config), "--no-progress")
        assert second.returncode == EXIT_USAGE, second.stderr
        message = " ".join(second.stderr.split())
        assert "in use by pbgtrain fit" in message and f"pid {holder.pid}" in message, message
        assert holder.poll() is None  # the holder was not disturbed
        found = holder_of(config.parent / "checkpoint")
        assert found is not None and found.pid == holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_after_kill_9_of_the_holder_the_next_fit_starts_and_resumes(tmp_path: Path) -> None:
    config = _layout(tmp_path, 1000, num_epochs=200, num_edge_chunks=2)  # far more than runs before the kill
    ckpt = CheckpointDir(config.parent / "checkpoint")
    holder = _start_holder(config, min_version=2)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    killed_at = ckpt.read_version()
    left = json.loads((ckpt.path / naming.CHECKPOINT_LOCK).read_text())
    assert left["pid"] == holder.pid  # the lock file stays behind, naming a dead holder …
    assert holder_of(ckpt.path) is None  # … but nobody holds the lock
    # The next run takes the lock and resumes from the committed version (a few iterations suffice).
    result = fit(load_run_config(config), FitOptions(max_iterations=2))
    assert result.start_version == killed_at and result.final_version == killed_at + 2
    assert not (ckpt.path / naming.CHECKPOINT_LOCK).exists()
    report = validate_path(config)
    assert report.ok, report.issues


def _iteration_version(info: object) -> int:
    """The version an iteration writes: its index in the plan + 1."""
    epoch, path, paths, chunk, chunks = (getattr(info, k) for k in (
        "epoch_idx", "edge_path_idx", "num_edge_paths", "edge_chunk_idx", "num_edge_chunks"))
    return (epoch * paths + path) * chunks + chunk + 1


@pytest.mark.slow  # readers beside 32 commits: about 10 s
def test_readers_see_one_complete_version_while_fit_commits(tmp_path: Path) -> None:
    epochs, chunks = 16, 2
    config = _layout(tmp_path, 600, num_epochs=epochs, num_edge_chunks=chunks)
    run = load_run_config(config)
    ckpt = CheckpointDir(run.checkpoint_path)
    num_entities = 60 + 40  # the example's users and items
    test_edges = sum(bucket_length(p) for p in (config.parent / TEST_EDGE_PATH).glob("edges_*.h5"))
    seen: dict[str, Counter[int]] = {name: Counter() for name in ("files", "export", "eval", "validate", "cli")}
    failures: list[str] = []
    done = threading.Event()

    def files_of_one_version(version: int) -> int:
        """Every file of ``version`` read whole; each says which iteration wrote it."""
        paths = [ckpt.model_path(version), *(ckpt.embeddings_path(etype, part, version)
                                             for etype, part in (("user", 0), ("user", 1), ("item", 0)))]
        for path in paths:
            info = ckpt.read_metadata(path).iteration
            assert info is not None and _iteration_version(info) == version, (path.name, info)
        for etype, part in (("user", 0), ("user", 1), ("item", 0)):
            ckpt.read_embeddings(etype, part, version)
        ckpt.read_model(version)
        return version

    def loop(name: str, read: object) -> None:
        while not done.is_set():
            try:
                version = read()  # type: ignore[operator]
            except Exception as exc:  # every failure is one
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
            else:
                seen[name][-1 if version is None else version] += 1  # -1: a read that names no version

    def export() -> int:
        out = tmp_path / f"export-{threading.get_ident()}.tsv"
        report = export_embeddings(config, out, overwrite=True)
        lines = out.read_text().splitlines()
        assert len(lines) == num_entities == sum(report.rows.values()), (len(lines), report.rows)
        return report.version

    def evaluate() -> int:
        result = evaluate_checkpoint(run, EvalOptions(edge_paths=[config.parent / TEST_EDGE_PATH], all_entities=True))
        assert result.metrics.count == test_edges  # every held-out edge, ranked
        return result.version

    def validate() -> int | None:
        report = validate_path(config)
        assert report.ok and not report.warnings, [str(i) for i in report.issues]
        return None

    def validate_cli() -> int | None:
        done_cli = subprocess.run([sys.executable, "-m", "pbgio", "validate", str(config)], capture_output=True,
                                  text=True, timeout=120)
        assert done_cli.returncode == 0, done_cli.stdout[-2000:] + done_cli.stderr[-2000:]
        return None

    proc = _start_holder(config)
    readers = [threading.Thread(target=loop, args=(name, read), daemon=True) for name, read in (
        ("files", lambda: read_committed(ckpt, files_of_one_version)), ("export", export), ("eval", evaluate),
        ("validate", validate), ("cli", validate_cli))]
    for thread in readers:
        thread.start()
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        done.set()
        for thread in readers:
            thread.join(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert ckpt.read_version() == epochs * chunks
    reads = {name: sum(c.values()) for name, c in seen.items()}
    versions = set().union(*(set(c) for c in seen.values())) - {-1}
    print(f"reads {reads}, {len(versions)} versions seen of {epochs * chunks}, "
          f"{len(failures)} failures")
    assert not failures, failures[:5]
    assert reads["files"] >= 20 and reads["export"] >= 5 and reads["eval"] >= 3 and reads["validate"] >= 3, reads
    assert len(versions) >= 10, sorted(versions)
