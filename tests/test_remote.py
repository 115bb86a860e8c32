"""Layouts on remote storage: the whole pipeline on ``memory://`` and on a real S3 server (moto in
server mode on localhost, spoken to over HTTP by s3fs), crash safety of the checkpoint commit on
the object store, and remote failures as pbgio errors.

Set ``PBG_TEST_HDFS_URL`` (e.g. ``hdfs://namenode:8020/tmp/pbg-test``) to run the pipeline
against an HDFS cluster as well (needs pyarrow and libhdfs with a JVM; see docs/guides/remote.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from pbgio import storage
from pbgio.checkpoint import CheckpointDir
from pbgio.errors import MissingArtifactError, PbgioError
from pbgio.exporters.embeddings import export_embeddings
from pbgio.importers import import_edge_lists
from pbgio.testing.s3server import ACCESS_DENIED, Request, Response, S3Server
from pbgio.validate import validate_path
from pbgtrain.config import load_run_config
from pbgtrain.evaluate import EvalOptions, evaluate_checkpoint
from pbgtrain.train import FitOptions, fit

NUM_NODES = 120


def _config(root: str | None = None) -> dict[str, object]:
    """A partitioned graph (2 partitions, 2 edge chunks). Its paths are relative to the config's
    directory, or, with ``root``, written out in full under it (absolute paths, or URLs): a run
    then names its data differently in every place, which must not change what it trains."""
    where = "" if root is None else f"{root}/"
    return {"entities": {"node": {"num_partitions": 2}},
            "relations": [{"name": "link", "lhs": "node", "rhs": "node", "operator": "diagonal"}],
            "dimension": 8, "num_epochs": 2, "num_edge_chunks": 2, "batch_size": 200, "num_batch_negs": 20,
            "num_uniform_negs": 20, "eval_fraction": 0.1, "workers": 1,
            "entity_path": f"{where}data", "edge_paths": [f"{where}data/edges"],
            "checkpoint_path": f"{where}model"}


def _edges_tsv(path: Path, num_edges: int = 3000, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    lhs = rng.integers(0, NUM_NODES, num_edges)
    rhs = (lhs + rng.integers(1, 4, num_edges)) % NUM_NODES  # local structure to learn
    path.write_text("".join(f"n{a}\tn{b}\n" for a, b in zip(lhs, rhs, strict=True)))
    return path


def _put(location: str, data: bytes) -> None:
    target = storage.resolve(location)
    if storage.is_remote(target):
        storage.write_bytes(target, data)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _pipeline(root: str, work: Path, *, full_paths: bool = False) -> dict[str, object]:
    """import → validate → fit → eval → export, every path under ``root`` (written in full in the
    config with ``full_paths``); what came out."""
    tsv = _edges_tsv(work / "edges.tsv")
    config = f"{root}/config.json"
    _put(config, json.dumps(_config(root if full_paths else None)).encode())
    _put(f"{root}/input/edges.tsv", tsv.read_bytes())
    imported = import_edge_lists(config, [f"{root}/input/edges.tsv"], options=_tsv_options(), seed=3)
    assert sum(imported.buckets[storage.display(storage.resolve(f"{root}/data/edges"))].values()) == 3000
    report = validate_path(config)
    assert report.ok, report.issues
    run = load_run_config(config)
    result = fit(run, FitOptions(seed=1))
    assert result.final_version == 4  # 2 epochs of 2 chunks
    report = validate_path(config)
    assert report.ok, report.issues
    metrics = evaluate_checkpoint(run, EvalOptions(seed=0)).metrics
    out = work / f"embeddings-{uuid.uuid4().hex}.tsv"
    export_embeddings(config, out)
    ckpt = CheckpointDir(run.checkpoint_path)
    files = {}
    for part in (0, 1):
        files[f"node_{part}"] = ckpt.read_embeddings("node", part).embeddings
        data = storage.resolve(f"{root}/data")
        files[f"names_{part}"] = (data / f"entity_names_node_{part}.json").read_bytes()
        for rhs in (0, 1):
            files[f"edges_{part}_{rhs}"] = (data / "edges" / f"edges_{part}_{rhs}.h5").read_bytes()
    files["model"] = ckpt.read_model().params
    files["stats"] = [{k: v for k, v in line.items() if k != "pbgtrain"} for line in ckpt.read_stats()]
    return {"files": files, "mrr": metrics.mrr, "export": out.read_text(), "version": ckpt.read_version(),
            "versions_on_disk": ckpt.versions_on_disk()}


def _tsv_options() -> object:
    from pbgio.importers import InputOptions

    return InputOptions(delimiter="\t", lhs_col=0, rhs_col=1, rel_col=None)


def _assert_same(remote: dict[str, object], local: dict[str, object]) -> None:
    assert remote["version"] == local["version"] == 4
    assert remote["versions_on_disk"] == local["versions_on_disk"] == [4]
    r_files, l_files = remote["files"], local["files"]
    assert isinstance(r_files, dict) and isinstance(l_files, dict)
    assert r_files.keys() == l_files.keys()
    for key, value in l_files.items():
        if key == "model":
            assert value.keys() == r_files[key].keys()
            for name in value:
                np.testing.assert_array_equal(r_files[key][name], value[name])
        elif isinstance(value, np.ndarray):
            np.testing.assert_array_equal(r_files[key], value, err_msg=key)
        elif key == "stats":
            assert [{k: v for k, v in s.items() if k != "time"} for s in r_files[key]] == \
                [{k: v for k, v in s.items() if k != "time"} for s in value]
        else:
            assert r_files[key] == value, key
    assert remote["export"] == local["export"]
    assert remote["mrr"] == local["mrr"]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    work = tmp_path_factory.mktemp("local")
    return _pipeline(str(work / "run"), work)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                 "AWS_EC2_METADATA_DISABLED", storage.TIMEOUT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(storage.TIMEOUT_ENV, "5")
    with S3Server(bucket=f"pbg-{uuid.uuid4().hex[:8]}") as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        yield server


def test_pipeline_on_memory_store_equals_local(local_run: dict[str, object], tmp_path: Path) -> None:
    _assert_same(_pipeline(f"memory://pbg-{uuid.uuid4().hex[:8]}/run", tmp_path), local_run)


def test_same_config_and_seed_train_the_same_embeddings_wherever_the_layout_is(
        local_run: dict[str, object], s3: S3Server, tmp_path: Path) -> None:
    """The config names its paths in full (two local directories, then s3:// URLs): the runs are
    bit-identical to each other and to the run whose paths are relative, held-out edges included
    (the hold-out and the shuffles are seeded by the edge path's index, not by how it is written)."""
    first = _pipeline(str(tmp_path / "first" / "run"), tmp_path, full_paths=True)
    _assert_same(first, local_run)
    _assert_same(_pipeline(str(tmp_path / "second" / "place"), tmp_path, full_paths=True), first)
    _assert_same(_pipeline(s3.url("full"), tmp_path, full_paths=True), first)


def test_pipeline_on_s3_server_equals_local(local_run: dict[str, object], s3: S3Server, tmp_path: Path) -> None:
    _assert_same(_pipeline(s3.url("run"), tmp_path), local_run)
    # Nothing was staged beside the layout: only layout files, the config and the input.
    keys = storage.resolve(s3.url("run")).fs.find(f"{s3.bucket}/run")
    assert not [k for k in keys if k.endswith((".tmp", ".uploading"))], keys


@pytest.mark.skipif(not os.environ.get("PBG_TEST_HDFS_URL"), reason="PBG_TEST_HDFS_URL names no HDFS cluster")
def test_pipeline_on_hdfs_equals_local(local_run: dict[str, object], tmp_path: Path) -> None:
    root = f"{os.environ['PBG_TEST_HDFS_URL'].rstrip('/')}/{uuid.uuid4().hex[:8]}"
    _assert_same(_pipeline(root, tmp_path), local_run)


def test_hdfs_url_reaches_fsspec_hdfs_and_fails_clearly_without_libhdfs() -> None:
    import fsspec

    assert fsspec.get_filesystem_class("hdfs").__module__ == "fsspec.implementations.arrow"
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        pyarrow_missing = True
    else:
        pyarrow_missing = False
    with pytest.raises(PbgioError) as info:
        validate_path("hdfs://user:s3cret@127.0.0.1:1/graph")
    message = str(info.value)
    assert "s3cret" not in message and "hdfs://" in message
    if pyarrow_missing:  # the message says what to install, and names the (redacted) URL
        assert isinstance(info.value, storage.UnsupportedStorageError)
        assert "hdfs://***@127.0.0.1:1/graph" in message and "pip install pyarrow" in message
    else:  # fsspec's arrow HDFS implementation was reached; libhdfs or the cluster is missing
        assert isinstance(info.value, storage.StorageError)


# ------------------------------------------------------------------------- errors


def test_wrong_bucket_missing_object_and_redaction(s3: S3Server) -> None:
    with pytest.raises(MissingArtifactError) as info:
        validate_path("s3://no-such-bucket-pbg/run/config.json")
    assert "s3://no-such-bucket-pbg/run/config.json" in str(info.value)
    with pytest.raises(MissingArtifactError) as missing:
        CheckpointDir(s3.url("run/model")).read_embeddings("node", 0, 3)
    assert f"{s3.url('run/model')}/embeddings_node_0.v3.h5" in str(missing.value)
    assert storage.redact(f"s3://AKIA:secret@{s3.bucket}/x") == f"s3://***@{s3.bucket}/x"


def test_cached_bucket_errors_name_the_url_and_a_replaced_object_is_fetched_again(tmp_path: Path) -> None:
    from pbgio.edges import read_bucket
    from pbgio.errors import CorruptFileError

    url = f"memory://pbg-{uuid.uuid4().hex[:8]}/edges/edges_0_0.h5"
    _put(url, b"not an HDF5 file")
    cache = storage.LocalCache(max_bytes=1 << 20, directory=tmp_path / "cache")
    try:
        with pytest.raises(CorruptFileError) as corrupt, storage.relocated(cache, storage.resolve(url)) as local:
            read_bucket(local)
        assert corrupt.value.file == url and url in str(corrupt.value) and str(tmp_path) not in str(corrupt.value)
        _put(url, b"also not HDF5, but longer")
        assert cache.local(storage.resolve(url)).read_bytes() == b"also not HDF5, but longer"
        assert cache.bytes_fetched == len(b"not an HDF5 file") + len(b"also not HDF5, but longer")
    finally:
        cache.close()


def _hooked_run(s3: S3Server, tmp_path: Path) -> str:
    root = s3.url("run")
    _put(f"{root}/config.json", json.dumps(_config()).encode())
    _put(f"{root}/input/edges.tsv", _edges_tsv(tmp_path / "e.tsv").read_bytes())
    import_edge_lists(f"{root}/config.json", [f"{root}/input/edges.tsv"], options=_tsv_options())
    return root


def test_denied_access_is_a_storage_error_naming_the_url(s3: S3Server, tmp_path: Path) -> None:
    root = _hooked_run(s3, tmp_path)
    s3.hook = lambda r: ACCESS_DENIED if "/data/edges/" in r.path else None
    with pytest.raises(storage.StorageError) as info:
        validate_path(f"{root}/config.json")
    assert "access denied" in str(info.value).lower() and f"{root}/data/edges" in str(info.value)


def test_server_gone_fails_within_the_timeout(s3: S3Server, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    root = _hooked_run(s3, tmp_path)
    monkeypatch.setenv(storage.TIMEOUT_ENV, "1")
    s3.stop()
    started = time.monotonic()
    with pytest.raises(PbgioError) as gone:
        validate_path(f"{root}/config.json")
    assert time.monotonic() - started < 60
    assert f"{root}/config.json" in str(gone.value)


@pytest.mark.slow  # waits out three request timeouts (test_server_gone_fails_within_the_timeout is fast)
def test_unanswering_server_fails_within_a_few_timeouts(s3: S3Server, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that accepts connections but never answers: every request times out after
    PBG_STORAGE_TIMEOUT, is tried at most three times, and the first failure ends the command."""
    root = _hooked_run(s3, tmp_path)
    monkeypatch.setenv(storage.TIMEOUT_ENV, "1")
    released = threading.Event()

    def hang(request: Request) -> None:
        if "/data/edges/" in request.path:
            released.wait(120)

    s3.hook = hang
    try:
        started = time.monotonic()
        with pytest.raises(storage.StorageError) as hung:
            validate_path(f"{root}/config.json")
        elapsed = time.monotonic() - started
    finally:
        released.set()
    assert "timed out" in str(hung.value) and f"{root}/data/edges" in str(hung.value)
    assert elapsed < 3 * 1 + 10, elapsed


# ------------------------------------------------------------------------- crash safety


@pytest.mark.slow  # a trainer killed at each write of a commit: about 50 s
def test_kill_9_during_checkpoint_upload_leaves_the_last_version_loadable(s3: S3Server, tmp_path: Path) -> None:
    """A trainer killed at each write of a checkpoint commit (before or after the store takes it):
    every time, the committed version loads, and the next run resumes and completes."""
    root = _hooked_run(s3, tmp_path)
    cfg = _config()
    cfg["num_epochs"] = 4
    _put(f"{root}/config.json", json.dumps(cfg).encode())
    ckpt = CheckpointDir(f"{root}/model")
    env = {**os.environ, **s3.env(), storage.TIMEOUT_ENV: "5"}
    victim: dict[str, subprocess.Popen[bytes] | int] = {}
    lock = threading.Lock()

    def kill_at(request: Request) -> Response | None:
        if request.method not in ("PUT", "POST", "DELETE") or "/model/" not in request.path:
            return None
        with lock:
            victim["writes"] = int(victim.get("writes", 0)) + 1
            if victim["writes"] == victim["at"]:
                proc = victim["proc"]
                assert isinstance(proc, subprocess.Popen)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return Response(500, "InternalError", "client killed")
        return None

    s3.hook = kill_at
    command = [sys.executable, "-m", "pbgtrain", "fit", f"{root}/config.json", "--no-progress", "--seed", "1"]
    kills = 0
    for at in (1, 2, 3, 4, 5, 6, 7, 9, 11, 14):
        before = ckpt.read_version()
        if before >= 8:  # 4 epochs of 2 chunks
            break
        victim.clear()
        victim["at"] = at
        victim["proc"] = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        proc = victim["proc"]
        _, err = proc.communicate(timeout=300)
        if proc.returncode == -signal.SIGKILL:
            kills += 1
        else:
            assert proc.returncode == 0, err.decode()[-2000:]
        after = ckpt.read_version()
        assert after >= before
        # The committed version is whole: its partitions and model load.
        if after:
            for part in (0, 1):
                assert ckpt.read_embeddings("node", part).embeddings.shape[1] == 8
            ckpt.read_model()
    assert kills >= 6
    s3.hook = None
    finished = subprocess.run(command, env=env, capture_output=True, timeout=300)
    assert finished.returncode == 0, finished.stderr.decode()[-2000:]
    assert ckpt.read_version() == 8
    report = validate_path(f"{root}/config.json")
    assert report.ok, report.issues
