"""Distributed training: real trainer processes on localhost over gloo, and the lock server's rules.

The graphs are planted (:mod:`pbgio.testing.planted`): one type in 4 partitions, so 4×4
buckets. Each run's own ``training_stats.json`` says which rank trained which bucket of which
chunk, and when; from it the tests check that every bucket of every chunk was trained
exactly once per pass and that no two trainers held a partition at the same time.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pbgio.checkpoint import CheckpointDir
from pbgio.testing.planted import TEST_EDGE_PATH, planted_graph
from pbgio.validate import validate_path
from pbgtrain.config import load_run_config
from pbgtrain.distributed.cluster import Cluster, DistributedError, Launch, resolve_launch
from pbgtrain.distributed.lock_server import LockServerScheduler
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
from pbgtrain.schedule.buckets import Bucket, PartitionSides, Wait, all_buckets, choose_bucket
from pbgtrain.train import FitOptions, fit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distributed_runs import run_trainers, start_torchrun, start_trainers, wait_all

NODE = PartitionSides(frozenset({"node"}), frozenset({"node"}))
BIPARTITE = PartitionSides(frozenset({"user"}), frozenset({"item"}))


# --------------------------------------------------------------------------- the lock server's rule


@given(st.integers(1, 5), st.integers(1, 5), st.data())
def test_choose_bucket_grants_only_free_partitions_and_never_stalls(nl: int, nr: int, data: st.DataObject) -> None:
    layout = data.draw(st.sampled_from([NODE, BIPARTITE]))
    order = all_buckets(nl, nr)
    done = data.draw(st.sets(st.sampled_from(order)))
    keys = sorted({key for b in order for key in layout.partitions(b)})
    locks = data.draw(st.dictionaries(st.sampled_from(keys), st.integers(0, 3)))
    rank = data.draw(st.integers(0, 3))
    chosen = choose_bucket(order, done, locks, rank, layout, {"node": 10, "user": 10, "item": 5})
    free = [b for b in order if b not in done and all(locks.get(k, rank) == rank for k in layout.partitions(b))]
    if chosen is None:
        assert not free
    else:
        assert chosen in free


def test_choose_bucket_prefers_reusing_what_the_trainer_holds() -> None:
    order = all_buckets(3, 3)
    # Rank 0 holds node/2 from its last bucket: (2, 2) moves nothing, anything else moves rows.
    assert choose_bucket(order, [], {("node", 2): 0}, 0, NODE, {"node": 10}) == Bucket(2, 2)
    # Bipartite: holding user/1 and item/0, bucket (1, 0) is free of cost.
    assert choose_bucket(order, [], {("user", 1): 0, ("item", 0): 0}, 0, BIPARTITE, {"user": 5, "item": 5}) \
        == Bucket(1, 0)


def test_tree_init_order_needs_a_trained_side_on_the_first_pass() -> None:
    order = all_buckets(3, 3)
    initialized = {("node", 0)}
    assert choose_bucket(order, [Bucket(0, 0)], {}, 1, NODE, {"node": 1}, initialized) == Bucket(0, 1)
    assert choose_bucket([Bucket(1, 2), Bucket(2, 1)], [], {}, 1, NODE, {"node": 1}, initialized) is None


def test_launch_from_rank_or_torchrun_and_its_mistakes() -> None:
    assert resolve_launch(num_machines=2, init_method="tcp://h:1", rank=0, env={}) == \
        Launch(0, 2, "tcp://h:1", "--rank")
    with pytest.raises(DistributedError, match="distributed_init_method"):
        resolve_launch(num_machines=2, init_method=None, rank=1, env={})
    with pytest.raises(DistributedError, match=r"--rank 2: expected a rank in \[0, 2\)"):
        resolve_launch(num_machines=2, init_method="tcp://h:1", rank=2, env={})
    with pytest.raises(DistributedError, match="start each trainer with --rank"):
        resolve_launch(num_machines=3, init_method="tcp://h:1", rank=None, env={})
    with pytest.raises(DistributedError, match="torchrun started 4 trainer"):
        resolve_launch(num_machines=2, init_method=None, rank=None, env={"RANK": "0", "WORLD_SIZE": "4"})
    assert resolve_launch(num_machines=1, init_method=None, rank=None, env={"RANK": "0", "WORLD_SIZE": "1"}) is None


# --------------------------------------------------------------------------- the lock server in a real store


def test_lock_server_threads_more_trainers_than_buckets_each_bucket_once() -> None:
    """Six trainers on 2×2 buckets over a real TCPStore: no deadlock, no shared partition, each bucket once."""
    import torch.distributed as dist

    world, passes = 6, 3
    master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    held: dict[tuple[str, int], int] = {}
    guard = threading.Lock()
    trained: list[tuple[int, Bucket, int]] = []
    errors: list[BaseException] = []
    between_passes = threading.Barrier(world)

    def trainer(rank: int) -> None:
        try:
            cluster = Cluster(Launch(rank, world, "unused", "test"))
            cluster.store = dist.TCPStore("127.0.0.1", master.port, None, False, timeout=timedelta(seconds=30))
            sched = LockServerScheduler(cluster, 2, 2, "random", NODE, {"node": 10}, seed=1, tree_init=True)
            for pass_idx in range(passes):
                sched.new_pass(pass_idx)
                mine: set[tuple[str, int]] = set()
                while (got := sched.acquire()) is not None:
                    if isinstance(got, Wait):
                        with guard:
                            for key in mine:
                                held.pop(key)
                        sched.hand_back(mine)
                        mine = set()
                        time.sleep(0.005)
                        continue
                    needed = set(NODE.partitions(got))
                    with guard:
                        for key in needed - mine:
                            assert key not in held, f"{key} held by {held[key]} when rank {rank} took {got}"
                            held[key] = rank
                        for key in mine - needed:
                            held.pop(key)
                    sched.hand_back(mine - needed)
                    mine = needed
                    trained.append((pass_idx, got, rank))
                    time.sleep(0.01)
                    sched.release(got)
                with guard:
                    for key in mine:
                        held.pop(key)
                sched.hand_back(mine)
                between_passes.wait(timeout=30)  # as the trainers' commit barrier
        except BaseException as exc:  # reported by the main thread (the other threads are left stuck)
            errors.append(exc)

    threads = [threading.Thread(target=trainer, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while any(t.is_alive() for t in threads) and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a trainer is stuck"
    counts = Counter((p, b) for p, b, _ in trained)
    assert set(counts) == {(p, b) for p in range(passes) for b in all_buckets(2, 2)}
    assert set(counts.values()) == {1}


# --------------------------------------------------------------------------- real trainers


def _graph(tmp_path: Path, **overrides: Any) -> Path:
    settings: dict[str, Any] = {"num_nodes": 400, "num_edges": 8000, "num_edge_chunks": 2, "num_epochs": 2}
    settings.update(overrides)
    return planted_graph(tmp_path / "graph", num_partitions=4, **settings)


def _bucket_lines(checkpoint: Path) -> list[dict[str, Any]]:
    return [line for line in CheckpointDir(checkpoint).read_stats() if "lhs_partition" in line]


def check_schedule(lines: list[dict[str, Any]], passes: int, nparts: int = 4) -> set[int]:
    """Every bucket once per pass, no partition held by two ranks at once; returns the ranks that trained."""
    per_pass = Counter((line["epoch_idx"], line["edge_chunk_idx"], line["lhs_partition"], line["rhs_partition"])
                       for line in lines)
    assert len(per_pass) == passes * nparts * nparts, sorted(per_pass)
    assert set(per_pass.values()) == {1}
    extra = [line["pbgtrain"] for line in lines]
    for a, ea in zip(lines, extra, strict=True):
        for b, eb in zip(lines, extra, strict=True):
            if ea["rank"] >= eb["rank"] or ea["trained_until"] <= eb["trained_from"] \
                    or eb["trained_until"] <= ea["trained_from"]:
                continue
            shared = {a["lhs_partition"], a["rhs_partition"]} & {b["lhs_partition"], b["rhs_partition"]}
            assert not shared, f"ranks {ea['rank']} and {eb['rank']} both held partition(s) {shared} at once"
    return {e["rank"] for e in extra}


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4])
def test_trainers_share_the_buckets_and_commit_valid_checkpoints(tmp_path: Path, world: int) -> None:
    config = _graph(tmp_path)
    done = run_trainers(config, world, overrides=["verbose=1"])
    checkpoint = config.parent / "checkpoint"
    assert CheckpointDir(checkpoint).read_version() == 4  # 2 epochs × 2 chunks
    assert CheckpointDir(checkpoint).versions_on_disk() == [4]
    report = validate_path(config.parent)
    assert report.ok, report.issues
    ranks = check_schedule(_bucket_lines(checkpoint), passes=4)
    assert len(ranks) >= 2, f"only rank(s) {ranks} trained"
    assert all(line.startswith(f"[rank {f.rank}] ") for f in done for line in f.stderr.splitlines()
               if line.strip() and not line.startswith("W")), done[1].stderr[-2000:]
    # The distributed checkpoint resumes on one machine.
    result = fit(load_run_config(config, ["num_epochs=3", "hogwild_delay=0"]), FitOptions())
    assert (result.start_version, result.final_version) == (4, 6)
    assert validate_path(config.parent).ok


@pytest.mark.distributed
def test_torchrun_launch(tmp_path: Path) -> None:
    config = _graph(tmp_path, num_epochs=1, num_edge_chunks=1)
    [finished] = wait_all([start_torchrun(config, 2)], timeout=240)
    assert finished.returncode == 0, finished.stderr[-4000:]
    assert CheckpointDir(config.parent / "checkpoint").read_version() == 1
    check_schedule(_bucket_lines(config.parent / "checkpoint"), passes=1)


@pytest.mark.distributed
def test_single_process_checkpoint_resumes_distributed(tmp_path: Path) -> None:
    config = _graph(tmp_path)
    fit(load_run_config(config, ["num_epochs=1"]), FitOptions())
    run_trainers(config, 2)
    assert CheckpointDir(config.parent / "checkpoint").read_version() == 4
    lines = _bucket_lines(config.parent / "checkpoint")
    check_schedule([line for line in lines if line["epoch_idx"] == 1], passes=2)


def _wait_for_version(checkpoint: Path, version: int, procs: list[Any], timeout: float = 120) -> None:
    started = time.monotonic()
    while CheckpointDir(checkpoint).read_version() < version:
        assert all(p.poll() is None for p in procs), "a trainer ended before the checkpoint it should reach"
        assert time.monotonic() - started < timeout, f"version {version} not committed in {timeout} s"
        time.sleep(0.05)


@pytest.mark.distributed
@pytest.mark.parametrize("victim", [1, 0])
def test_kill_9_of_one_trainer_stops_the_others_and_the_rerun_completes(tmp_path: Path, victim: int) -> None:
    config = _graph(tmp_path, num_edges=60_000, num_epochs=6, num_edge_chunks=1, batch_size=100)
    checkpoint = config.parent / "checkpoint"
    peer_timeout = 5.0
    procs = start_trainers(config, 3, peer_timeout=peer_timeout)
    _wait_for_version(checkpoint, 1, procs)
    time.sleep(0.3)  # inside the next iteration
    procs[victim].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    finished = wait_all(procs, timeout=120)
    survivors = [f for f in finished if f.rank != victim]
    for f in survivors:
        stopped_after = f.ended_at - killed_at
        print(f"rank {f.rank} stopped {stopped_after:.1f} s after rank {victim} was killed")
        assert f.returncode == 1, f.stderr[-3000:]
        assert f"rank {victim}" in f.stderr, f.stderr[-3000:]
        assert stopped_after < peer_timeout + 10, f"rank {f.rank} stopped {stopped_after:.1f} s after the kill"
    version = CheckpointDir(checkpoint).read_version()
    assert 1 <= version < 6
    report = validate_path(config.parent)
    assert report.ok, report.issues
    run_trainers(config, 3)  # the same command again resumes and completes
    assert CheckpointDir(checkpoint).read_version() == 6
    lines = _bucket_lines(checkpoint)
    assert {line["epoch_idx"] for line in lines} == set(range(6))


@pytest.mark.distributed
def test_ctrl_c_on_one_trainer_stops_all(tmp_path: Path) -> None:
    config = _graph(tmp_path, num_edges=60_000, num_epochs=6, num_edge_chunks=1, batch_size=100)
    checkpoint = config.parent / "checkpoint"
    procs = start_trainers(config, 2, peer_timeout=30)
    _wait_for_version(checkpoint, 1, procs)
    procs[1].send_signal(signal.SIGINT)
    interrupted_at = time.monotonic()
    finished = wait_all(procs, timeout=60)
    assert finished[1].returncode == 130, finished[1].stderr[-3000:]
    assert finished[0].returncode == 1 and "rank 1 was interrupted" in finished[0].stderr, finished[0].stderr[-3000:]
    assert finished[0].ended_at - interrupted_at < 15  # the abort, not the 30 s peer timeout, stopped rank 0
    assert validate_path(config.parent).ok


# --------------------------------------------------------------------------- quality


def _filtered_mrr(config: Path, overrides: list[str]) -> float:
    run = load_run_config(config, overrides)
    layout = config.parent
    result = evaluate_checkpoint(run, EvalOptions(edge_paths=[layout / TEST_EDGE_PATH],
                                                  filter_paths=[layout / "edges/train", layout / TEST_EDGE_PATH]))
    return result.metrics.mrr


@pytest.mark.distributed
def test_quality_parity_with_one_trainer(tmp_path: Path) -> None:
    """Filtered MRR of 2 and 4 trainers within 0.01 of one process, same config and epochs."""
    settings = {"num_nodes": 1000, "num_edges": 30_000, "num_epochs": 5, "num_edge_chunks": 1,
                "num_communities": 50}
    mrr = {}
    for world in (1, 2, 4):
        config = _graph(tmp_path / f"w{world}", **settings)
        if world == 1:
            fit(load_run_config(config, ["workers=1"]), FitOptions())
        else:
            run_trainers(config, world)
        mrr[world] = _filtered_mrr(config, [])
    print(json.dumps(mrr))
    assert mrr[1] > 0.3  # chance, against the 250 nodes of a partition: about 0.025
    assert abs(mrr[2] - mrr[1]) <= 0.01 and abs(mrr[4] - mrr[1]) <= 0.01, mrr


@pytest.mark.distributed
@pytest.mark.slow
def test_fb15k_237_quality_parity_with_one_trainer(tmp_path: Path) -> None:
    """FB15k-237 in 4 partitions: filtered MRR of 2 and 4 trainers within 0.01 of one process.

    Ranked against the entities of the test edge's partition (the partitioned protocol of
    ``pbgtrain eval``), the same for all three runs. About 10 minutes on 2 cores.
    """
    from test_train_datasets import SPLITS, _layout

    mrr = {}
    for world in (1, 2, 4):
        config = _layout(tmp_path / f"w{world}", "fb15k-237", entities={"all": {"num_partitions": 4}},
                         dimension=100, num_epochs=5, workers=1, hogwild_delay=0)
        train_only = ["edge_paths=layout/train"]
        if world == 1:
            fit(load_run_config(config, train_only), FitOptions())
        else:
            run_trainers(config, world, overrides=train_only, timeout=1800)
        layout = config.parent / "layout"
        run = load_run_config(config)
        result = evaluate_checkpoint(run, EvalOptions(edge_paths=[layout / "test"],
                                                      filter_paths=[layout / s for s in SPLITS]))
        mrr[world] = result.metrics.mrr
        print(world, result.metrics)
    print(json.dumps(mrr))
    assert mrr[1] > 0.2
    assert abs(mrr[2] - mrr[1]) <= 0.01 and abs(mrr[4] - mrr[1]) <= 0.01, mrr


@pytest.mark.distributed
def test_a_stopped_rank_0_stops_the_others_and_does_no_harm_when_continued(tmp_path: Path) -> None:
    """SIGSTOP of rank 0, which serves the store: its connections stay open and torch's store calls
    wait forever, so only the store sentry (pbgtrain.distributed.cluster) gets the others out."""
    config = _graph(tmp_path, num_edges=60_000, num_epochs=6, num_edge_chunks=1, batch_size=100)
    checkpoint = config.parent / "checkpoint"
    procs = start_trainers(config, 3, peer_timeout=5.0)
    _wait_for_version(checkpoint, 1, procs)
    time.sleep(0.3)
    procs[0].send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        survivors = wait_all(procs[1:], timeout=60)
    finally:
        procs[0].send_signal(signal.SIGCONT)
    version = CheckpointDir(checkpoint).read_version()
    for f in survivors:
        assert f.returncode == 1, f.stderr[-3000:]
        assert "rank 0" in f.stderr and "run the same command" in f.stderr, f.stderr[-3000:]
        assert "Traceback" not in f.stderr, f.stderr[-3000:]
        assert f.ended_at - stopped_at < 5.0 + 10
    [rank0] = wait_all(procs[:1], timeout=60)  # continued: it finds the others gone and stops
    assert rank0.returncode != 0 and "Traceback" not in rank0.stderr, rank0.stderr[-3000:]
    assert CheckpointDir(checkpoint).read_version() == version
    assert validate_path(config.parent).ok
    run_trainers(config, 3)
    assert CheckpointDir(checkpoint).read_version() == 6
