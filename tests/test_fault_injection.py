"""Faults on writes — a full disk, I/O errors on write and on fsync, a read-only or vanished
output directory — during `pbgtrain fit` checkpoint commits, `pbgio import`, `pbgio convert` and
`pbgio export`. Each ends with one clear error line (no traceback) naming the file the user asked
for, the previous committed state intact, no output that looks complete but is not, and the same
command succeeding once the fault is gone.

The faults are the OS's own errors: an LD_PRELOAD shim makes libc's write/fsync/open calls on
the output's paths fail (pbgio.testing.faults), and a size-limited tmpfs fills up for real
where this machine may mount one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.testing.faults import FaultsUnavailable, build_shim, shim_env, small_tmpfs
from pbgio.testing.planted import planted_graph
from pbgio.validate import validate_path

try:
    build_shim()
except FaultsUnavailable as exc:  # pragma: no cover - machines without a C compiler
    pytest.skip(str(exc), allow_module_level=True)

EXIT_FAILED = 1
FIT = ["-m", "pbgtrain", "fit", "--no-progress", "-p", "num_epochs=1", "-p", "num_edge_chunks=3"]


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def assert_clean_failure(done: subprocess.CompletedProcess[str], log: Path, names: str) -> None:
    """Exit 1, an error line naming ``names`` (a path), no traceback of pbg's code; the fault fired.

    (h5py itself may print "Exception ignored in ObjectID.__dealloc__" for the objects of the
    file whose write failed, as they are freed: noise from inside h5py, not a pbg traceback.)"""
    assert log.exists(), f"the fault never fired:\n{done.stderr}"
    assert done.returncode == EXIT_FAILED, done.stderr
    assert 'File "/' not in done.stderr and "│" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and names in done.stderr, done.stderr


# ------------------------------------------------------------------------------------- fit


@pytest.fixture(scope="module")
def one_version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A partitioned layout with version 1 of 3 committed (the state a fault must not harm)."""
    root = tmp_path_factory.mktemp("fit") / "layout"
    config = planted_graph(root, num_partitions=2, num_nodes=600, num_edges=3000, dimension=8, workers=1)
    done = run([*FIT, str(config), "--max-iterations", "1"])
    assert done.returncode == 0, done.stderr
    return root


def _copy(source: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "layout"
    shutil.copytree(source, root)
    return root / "config.json", root / "checkpoint"


def _version_bytes(checkpoint: Path) -> int:
    return sum(p.stat().st_size for p in checkpoint.glob("*.v1.h5"))


# The whole matrix: `pytest -m slow tests/test_fault_injection.py` (CI's slow step). The default run
# keeps one import and one convert case; every fit and export case starts a trainer first (module
# fixture `one_version`) and is slow.
SLOW = pytest.mark.slow
FIT_FAULTS = [  # (fault, where it starts: bytes into the next commit as a fraction of a version)
    ("enospc", 0.5), ("enospc", 0.0), ("eio", 0.0),
    ("eio", 0.9), ("eio-fsync", 0.0), ("erofs", 0.0),
]


@SLOW
@pytest.mark.parametrize(("fault", "fraction"), FIT_FAULTS)
def test_fit_fault_during_commit(one_version: Path, tmp_path: Path, fault: str, fraction: float) -> None:
    config, checkpoint = _copy(one_version, tmp_path)
    before = {p.name: p.read_bytes() for p in checkpoint.glob("*.v1.h5")}
    # The files of version 2 only: the fault meets the commit, not the lock or the stats.
    log = tmp_path / "fault.log"
    match = ".v2.h5" if fault != "erofs" else f"{checkpoint}/.model.v2"
    env = shim_env(fault, match, after=int(fraction * _version_bytes(checkpoint)), log=log)
    done = run([*FIT, str(config)], env)
    assert_clean_failure(done, log, str(checkpoint))
    assert "could not write" in done.stderr
    ckpt = CheckpointDir(checkpoint)
    assert ckpt.read_version() == 1
    assert {p.name: p.read_bytes() for p in checkpoint.glob("*.v1.h5")} == before
    ckpt.read_model(1)
    report = validate_path(config)
    assert report.ok, [str(i) for i in report.errors]
    rerun = run([*FIT, str(config)])
    assert rerun.returncode == 0, rerun.stderr
    assert CheckpointDir(checkpoint).read_version() == 3 and validate_path(config).ok


@SLOW
def test_fit_fault_on_the_version_file(one_version: Path, tmp_path: Path) -> None:
    """The commit point itself fails: version 2's files are complete, yet 1 stays the version."""
    config, checkpoint = _copy(one_version, tmp_path)
    log = tmp_path / "fault.log"
    env = shim_env("eio-fsync", ".checkpoint_version.txt", log=log)
    done = run([*FIT, str(config)], env)
    assert_clean_failure(done, log, "checkpoint_version.txt")
    assert CheckpointDir(checkpoint).read_version() == 1 and validate_path(config).ok
    assert run([*FIT, str(config)]).returncode == 0
    assert CheckpointDir(checkpoint).read_version() == 3


@SLOW
def test_fit_checkpoint_directory_vanishes(one_version: Path, tmp_path: Path) -> None:
    """The checkpoint directory is removed while the trainer runs: a clear error, not a traceback,
    and a rerun starts over."""
    config, checkpoint = _copy(one_version, tmp_path)
    proc = subprocess.Popen([sys.executable, *FIT, str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # Wait for the run to begin training (it has read version 1), then pull the directory away.
    for _ in range(600):
        if proc.poll() is not None or (checkpoint / ".pbg-lock").exists() or any(checkpoint.glob(".*.tmp")):
            break
        subprocess.run(["sleep", "0.05"])
    shutil.rmtree(checkpoint, ignore_errors=True)
    _, stderr = proc.communicate(timeout=300)
    assert "Traceback" not in stderr and 'File "/' not in stderr, stderr
    # Either it stops with one error line, or (the directory gone before anything of it was in
    # use) it carries on into a new directory; in both cases nothing half-written is left.
    assert proc.returncode in (0, EXIT_FAILED), stderr
    if proc.returncode == EXIT_FAILED:
        assert "error:" in stderr, stderr
        rerun = run([*FIT, str(config)])
        assert rerun.returncode == 0, rerun.stderr
    assert CheckpointDir(checkpoint).read_version() == 3
    assert validate_path(config).ok


@SLOW
def test_fit_on_a_disk_that_really_fills_up(one_version: Path, tmp_path: Path) -> None:
    """A tmpfs with room for one version and a half: the next commit meets the kernel's ENOSPC."""
    config, checkpoint = _copy(one_version, tmp_path)
    size = sum(p.stat().st_size for p in checkpoint.iterdir() if p.is_file())
    mount = config.parent / "disk"  # inside the layout: fit writes only beside its config unless told
    try:
        disk = small_tmpfs(mount, size + size // 2)
        disk.__enter__()
    except FaultsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        shutil.copytree(checkpoint, mount / "checkpoint")
        raw = json.loads(config.read_text())
        raw["checkpoint_path"] = str(mount / "checkpoint")
        config.write_text(json.dumps(raw))
        done = run([*FIT, str(config)])
        assert done.returncode == EXIT_FAILED, done.stderr
        assert "no space left on device (ENOSPC)" in done.stderr and 'File "/' not in done.stderr
        assert CheckpointDir(mount / "checkpoint").read_version() == 1 and validate_path(config).ok
        subprocess.run(["mount", "-o", f"remount,size={size * 8}", str(mount)], check=True)
        rerun = run([*FIT, str(config)])
        assert rerun.returncode == 0, rerun.stderr
        assert CheckpointDir(mount / "checkpoint").read_version() == 3 and validate_path(config).ok
    finally:
        disk.__exit__(None, None, None)


# ---------------------------------------------------------------------------------- import


def _import_case(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    root = tmp_path / "imp"
    root.mkdir()
    edges = root / "edges.tsv"
    edges.write_text("".join(f"n{i % 97}\tr{i % 3}\tn{(i * 7) % 97}\n" for i in range(3000)))
    config = root / "config.json"
    config.write_text(json.dumps({
        "entities": {"node": {"num_partitions": 2}},
        "relations": [{"name": f"r{i}", "lhs": "node", "rhs": "node"} for i in range(3)],
        "dimension": 8, "entity_path": "data", "edge_paths": ["data/edges"], "checkpoint_path": "model"}))
    return config, root / "data", ["-m", "pbgio", "import", str(config), str(edges), "--rel-col", "1",
                                   "--rhs-col", "2", "--no-progress"]


IMPORT_FAULTS = [  # (fault, files it meets, bytes written to them first, the path the error names)
    ("enospc", "edges_", 20_000, "data/edges/edges_0_0.h5"),  # in the middle of the first bucket
    pytest.param("enospc", "imp/data", 0, "data/entity_names_node_0.json", marks=SLOW),  # the first file
    pytest.param("eio", "edges_1_1", 10_000, "data/edges/edges_1_1.h5", marks=SLOW),
    pytest.param("eio-fsync", "edges_0_1", 0, "data/edges/edges_0_1.h5", marks=SLOW),
    pytest.param("enospc", "entity_count_node_1", 0, "data/entity_count_node_1.txt", marks=SLOW),
    pytest.param("erofs", "data/edges/", 0, "data/edges", marks=SLOW),
]


@pytest.mark.parametrize(("fault", "match", "after", "names"), IMPORT_FAULTS)
def test_import_fault(tmp_path: Path, fault: str, match: str, after: int, names: str) -> None:
    config, _data, command = _import_case(tmp_path)
    log = tmp_path / "fault.log"
    done = run(command, shim_env(fault, match, after=after, log=log))
    assert_clean_failure(done, log, str(tmp_path / "imp" / names))
    assert not list(tmp_path.rglob(".pbgio-import-*")) and not list(tmp_path.rglob("*.tmp")), "leftovers"
    report = validate_path(config)
    assert not report.ok, "a failed import left a layout that validates as complete"
    rerun = run(command)
    assert rerun.returncode == 0, rerun.stderr
    assert validate_path(config).ok


# --------------------------------------------------------------------------------- convert


@pytest.fixture(scope="module")
def legacy_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pbgio.testing.legacy_layouts import LegacySpec, write_legacy_layout

    root = tmp_path_factory.mktemp("legacy") / "legacy"
    write_legacy_layout(root, LegacySpec(seed=7, num_partitions=3, num_users=300, edges_per_bucket=5000))
    return root


CONVERT_FAULTS = [  # (fault, files it meets, bytes written to them first, the path the error names)
    ("enospc", "train_partitioned/.edges_1", 30_000, "out/data/train_partitioned/edges_1_0.h5"),
    pytest.param("enospc", ".out.pbgio-convert", 0, "out/config.json", marks=SLOW),
    pytest.param("eio", "checkpoint/.model", 2_000, "out/checkpoint/model.v1.h5", marks=SLOW),
    pytest.param("eio-fsync", "checkpoint_version", 0, "out/checkpoint/checkpoint_version.txt", marks=SLOW),
    pytest.param("enospc", "embeddings_user_1", 100, "out/checkpoint/embeddings_user_1.v1.h5", marks=SLOW),
    pytest.param("erofs", ".out.pbgio-convert", 0, "out", marks=SLOW),
]


@pytest.mark.parametrize(("fault", "match", "after", "names"), CONVERT_FAULTS)
def test_convert_fault(legacy_layout: Path, tmp_path: Path, fault: str, match: str, after: int,
                       names: str) -> None:
    source = tmp_path / "legacy"
    shutil.copytree(legacy_layout, source)
    command = ["-m", "pbgio", "convert", "--from", "legacy", str(source), str(tmp_path / "out"), "--no-progress"]
    log = tmp_path / "fault.log"
    done = run(command, shim_env(fault, match, after=after, log=log))
    assert_clean_failure(done, log, str(tmp_path / names))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fault.log", "legacy"], "a failed convert left output"
    rerun = run(command)
    assert rerun.returncode == 0, rerun.stderr
    assert validate_path(tmp_path / "out").ok


# ---------------------------------------------------------------------------------- export


@pytest.fixture(scope="module")
def trained(one_version: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``one_version`` with entity names, so that every export format applies."""
    from pbgio.config import load_config
    from pbgio.entities import read_entity_count, write_entity_names

    root = tmp_path_factory.mktemp("export") / "layout"
    shutil.copytree(one_version, root)
    cfg = load_config(root / "config.json")
    entities = root / cfg.entity_path
    for part in range(cfg.num_partitions("node")):
        count = read_entity_count(entities, "node", part)
        write_entity_names(entities, "node", part, [f"node-{part}-{i}" for i in range(count)])
    return root


EXPORT_FAULTS = [  # (format, fault, files it meets, bytes written to them first, the output the error names)
    ("npy", "enospc", "out/.node.npy", 3_000, "out/node.npy"),  # space reserved up front: ENOSPC, not SIGBUS
    ("tsv", "enospc", ".emb.tsv", 5_000, "emb.tsv"),
    ("tsv", "eio-fsync", ".relations.tsv", 0, "relations.tsv"),
    ("parquet", "eio", "out/", 2_000, "out/node.parquet"),
    ("npy", "enospc", "out/.node.names", 0, "out/node.names.json"),
    ("npy", "erofs", "out", 0, "out"),
]


@SLOW
@pytest.mark.parametrize(("fmt", "fault", "match", "after", "names"), EXPORT_FAULTS)
def test_export_fault(trained: Path, tmp_path: Path, fmt: str, fault: str, match: str, after: int,
                      names: str) -> None:
    """Embeddings and relations are one export: a fault in either leaves neither (no half set of
    outputs that a rerun without --overwrite would then refuse)."""
    output = tmp_path / ("emb.tsv" if fmt == "tsv" else "out")
    command = ["-m", "pbgio", "export", str(trained / "config.json"), "-o", str(output), "-f", fmt,
               "--relations-output", str(tmp_path / "relations.tsv"), "--no-progress"]
    log = tmp_path / "fault.log"
    done = run(command, shim_env(fault, f"{tmp_path}/{match}", after=after, log=log))
    assert_clean_failure(done, log, str(tmp_path / names))
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["fault.log"], "a failed export left output"
    rerun = run(command)
    assert rerun.returncode == 0, rerun.stderr
    assert (tmp_path / "relations.tsv").exists()


@SLOW
def test_export_to_a_disk_that_really_fills_up(trained: Path, tmp_path: Path) -> None:
    """An npy export larger than the tmpfs: the kernel's ENOSPC when the space is reserved, where a
    memory-mapped write would have died of SIGBUS."""
    mount = tmp_path / "disk"
    try:
        disk = small_tmpfs(mount, 16 * 1024)
        disk.__enter__()
    except FaultsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        command = ["-m", "pbgio", "export", str(trained / "config.json"), "-o", str(mount / "out"), "-f", "npy",
                   "--no-progress"]
        done = run(command)
        assert done.returncode == EXIT_FAILED, done.stderr
        assert "node.npy: could not write: no space left on device (ENOSPC)" in done.stderr, done.stderr
        assert not [p for p in mount.rglob("*") if p.is_file()]
        subprocess.run(["mount", "-o", "remount,size=4m", str(mount)], check=True)
        assert run(command).returncode == 0
        assert (mount / "out" / "node.npy").exists()
    finally:
        disk.__exit__(None, None, None)
