"""pbgtrain end to end on the bundled example: trains, commits valid checkpoints, resumes exactly.

The example (``pbgio example``) has a partitioned type (``user``, 2 partitions) and an
unpartitioned one (``item``), two static relations, and held-out ``edges/test``.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.example import TEST_EDGE_PATH, build_example
from pbgio.validate import validate_path
from pbgtrain.config import load_run_config
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
from pbgtrain.train import FitOptions, fit


@pytest.fixture
def example(tmp_path: Path) -> Path:
    return build_example(tmp_path / "layout", num_edges=3000)


def _files(directory: Path) -> dict[str, object]:
    """Every array of every committed file, by file and dataset name (attributes are compared by validate)."""
    ckpt = CheckpointDir(directory)
    version = ckpt.read_version()
    out: dict[str, object] = {}
    for path in ckpt.files_of_version(version):
        if path.name.startswith("embeddings_"):
            etype, part = path.name[len("embeddings_"):].split(".")[0].rsplit("_", 1)
            state = ckpt.read_embeddings(etype, int(part), version)
            out[path.name] = state.embeddings
            out[path.name + ":optimizer"] = state.optimizer_state
        else:
            model = ckpt.read_model(version)
            out.update({f"model:{k}": v for k, v in model.params.items()})
    return out


def test_trains_commits_valid_checkpoints_and_beats_chance(example: Path) -> None:
    run = load_run_config(example, ["num_epochs=6"])
    result = fit(run, FitOptions(seed=1))
    assert result.final_version == 6 and not result.stopped_early
    report = validate_path(example)
    assert report.ok, report.issues
    ckpt = CheckpointDir(run.checkpoint_path)
    assert ckpt.read_version() == 6
    assert sorted(p.name for p in ckpt.files_of_version(6)) == [
        "embeddings_item_0.v6.h5", "embeddings_user_0.v6.h5", "embeddings_user_1.v6.h5", "model.v6.h5"]
    assert ckpt.versions_on_disk() == [6]  # superseded versions removed
    *stats, closing = ckpt.read_stats()
    assert len(stats) == 6 * 4  # one record per bucket per iteration, then the run's (pbgtrain.run_log)
    assert closing["pbgtrain"]["run"]["end"] == "completed" and closing["pbgtrain"]["run"]["version"] == 6
    assert {(s["lhs_partition"], s["rhs_partition"]) for s in stats} == {(0, 0), (0, 1), (1, 0), (1, 1)}

    evaluation = evaluate_checkpoint(run, EvalOptions(edge_paths=[example.parent / TEST_EDGE_PATH],
                                                      all_entities=True))
    metrics = evaluation.metrics
    # Candidates: the 30 users of a partition (follows) or the 40 items (likes); chance MRR is about
    # H(n)/n, below 0.14 for either; the planted communities allow far better.
    chance = max(sum(1 / k for k in range(1, n + 1)) / n for n in (30, 40))
    assert metrics.count == 300
    assert metrics.mrr > 2 * chance, str(metrics)
    assert "all 30–40 entities of the partition" in metrics.protocol.describe()

    filtered = evaluate_checkpoint(run, EvalOptions(edge_paths=[example.parent / TEST_EDGE_PATH],
                                                    filter_paths=[example.parent / "edges/train",
                                                                  example.parent / TEST_EDGE_PATH]))
    assert filtered.metrics.mrr >= metrics.mrr
    assert filtered.metrics.protocol.filtered


def test_resume_gives_the_same_files_as_an_uninterrupted_run(tmp_path: Path) -> None:
    overrides = ["num_epochs=2", "num_edge_chunks=2", "eval_fraction=0.1"]
    straight = build_example(tmp_path / "a", num_edges=2000)
    resumed = build_example(tmp_path / "b", num_edges=2000)
    fit(load_run_config(straight, overrides), FitOptions(seed=3))
    first = fit(load_run_config(resumed, overrides), FitOptions(seed=3, max_iterations=1))
    assert first.stopped_early and first.final_version == 1
    second = fit(load_run_config(resumed, overrides), FitOptions(seed=3))
    assert second.start_version == 1 and second.final_version == 4
    a, b = _files(straight.parent / "checkpoint"), _files(resumed.parent / "checkpoint")
    assert a.keys() == b.keys()
    for name in a:
        if isinstance(a[name], np.ndarray):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert fit(load_run_config(resumed, overrides), FitOptions(seed=3)).iterations == []  # complete


def test_partitions_kept_in_memory_give_the_same_files_with_less_disk_traffic(tmp_path: Path) -> None:
    """--partition-memory keeps swapped-out partitions in memory until the commit: every committed
    file is the same as when they go to disk at each swap (the original's way), and fewer are saved."""
    overrides = ["num_epochs=2", "num_edge_chunks=2", "eval_fraction=0.1"]
    results, files = {}, {}
    for gib in (0.0, 1.0):
        config = build_example(tmp_path / str(gib), num_edges=2000)
        options = FitOptions(seed=3, partition_memory=gib, read_ahead_partitions=gib > 0)  # as on a GPU
        results[gib] = fit(load_run_config(config, overrides), options)
        files[gib] = _files(config.parent / "checkpoint")
        assert validate_path(config.parent).ok
    assert files[0.0].keys() == files[1.0].keys()
    for name, value in files[0.0].items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, files[1.0][name], err_msg=name)
    swapped, kept = results[0.0].movement[0], results[1.0].movement[0]
    assert swapped["partitions_kept_in_memory"] == 0 and kept["partitions_kept_in_memory"] > 0
    assert kept["partitions_saved"] < swapped["partitions_saved"]
    assert kept["partitions_loaded"] < swapped["partitions_loaded"]


def test_partitions_read_ahead_give_the_same_files(tmp_path: Path) -> None:
    """The next bucket's partitions read in the background (the GPU's default) change nothing on disk."""
    files = {}
    for ahead in (False, True):
        config = build_example(tmp_path / str(ahead), num_edges=2000)
        result = fit(load_run_config(config, ["num_epochs=2"]), FitOptions(seed=5, read_ahead_partitions=ahead))
        assert result.movement[0]["partitions_loaded"] > 0
        assert (result.movement[0]["partitions_read_ahead"] > 0) == ahead
        files[ahead] = _files(config.parent / "checkpoint")
    for name, value in files[False].items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, files[True][name], err_msg=name)


@pytest.mark.slow  # kills and restarts the trainer process: about 40 s
def test_kill_9_then_resume_completes_with_valid_checkpoints(tmp_path: Path) -> None:
    config = build_example(tmp_path / "layout", num_edges=20000)
    ckpt = CheckpointDir(config.parent / "checkpoint")
    args = [sys.executable, "-m", "pbgtrain", "fit", str(config), "-p", "num_epochs=4", "-p", "num_edge_chunks=3",
            "--no-progress"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while ckpt.read_version() < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "training ended before it could be killed; make it longer"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    killed_at = ckpt.read_version()
    assert 2 <= killed_at < 12
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert ckpt.read_version() == 12
    report = validate_path(config)
    assert report.ok, report.issues
    buckets = 4  # the stats index counts buckets: iteration × buckets + rank in the pass
    iterations = [s["index"] // buckets for s in ckpt.read_stats()]
    assert set(iterations) == set(range(12))


def test_init_path_warm_start_and_snapshots(tmp_path: Path) -> None:
    first = build_example(tmp_path / "first", num_edges=1000)
    fit(load_run_config(first, ["num_epochs=2", "checkpoint_preservation_interval=1"]), FitOptions())
    snapshots = sorted(p.name for p in (first.parent / "checkpoint").iterdir() if p.is_dir())
    assert snapshots == ["epoch_1", "epoch_2"]  # the state after 1 and 2 epochs, named as the original
    source = CheckpointDir(first.parent / "checkpoint")
    trained = source.read_embeddings("user", 0).embeddings

    second = build_example(tmp_path / "second", num_edges=1000)
    run = load_run_config(second, ["num_epochs=1", f"init_path={first.parent / 'checkpoint'}", "lr=0"])
    fit(run, FitOptions())
    warm = CheckpointDir(run.checkpoint_path).read_embeddings("user", 0).embeddings
    np.testing.assert_array_equal(warm, trained)  # lr=0: the warm start is carried over unchanged


def test_eval_reports_its_protocol_for_sampled_negatives(example: Path) -> None:
    run = load_run_config(example, ["num_epochs=1", "eval_num_batch_negs=10", "eval_num_uniform_negs=5"])
    fit(run, FitOptions())
    result = evaluate_checkpoint(run, EvalOptions(edge_paths=[example.parent / TEST_EDGE_PATH]))
    assert result.metrics.protocol.describe() == "raw, 10 batch + 5 uniform negatives, both sides averaged"
    assert 0 < result.metrics.mrr <= 1 and not math.isnan(result.metrics.auc)


@pytest.mark.slow  # a trainer process run until a commit, then interrupted: about 10 s
def test_ctrl_c_stops_at_a_committed_checkpoint(tmp_path: Path) -> None:
    config = build_example(tmp_path / "layout", num_edges=5000)
    ckpt = CheckpointDir(config.parent / "checkpoint")
    args = [sys.executable, "-m", "pbgtrain", "fit", str(config), "-p", "num_epochs=50", "--no-progress"]
    # A shell's background job inherits SIGINT ignored, and Python then keeps ignoring it: restore it.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while ckpt.read_version() < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "training ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    version = ckpt.read_version()
    assert 1 <= version < 50
    assert f"checkpoint version {version} is committed and intact" in " ".join(err.split())
    report = validate_path(config)
    assert report.ok, report.issues  # leftovers of the interrupted version are warnings at most
