"""The commit protocol: a crash between any two steps leaves the last committed version loadable."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from pbgio.checkpoint import (
    CheckpointDir,
    EmbeddingsState,
    FileMetadata,
    IterationInfo,
    ModelState,
    commit_steps,
    write_checkpoint,
)
from pbgio.config import ConfigSchema, load_config
from pbgio.example import build_example
from pbgio.optimizer_state import encode_adagrad, encode_row_adagrad
from pbgio.spec.checkpoint import expected_model_params
from pbgio.validate import validate_path


def states(cfg: ConfigSchema, version: int, counts: dict[tuple[str, int], int]) -> tuple[
        dict[tuple[str, int], EmbeddingsState], ModelState]:
    rng = np.random.default_rng(version)
    embeddings = {
        key: EmbeddingsState(rng.standard_normal((n, cfg.entity_dimension(key[0]))).astype(np.float32),
                             encode_row_adagrad(np.full(n, version, dtype=np.float32), lr=0.1))
        for key, n in counts.items()
    }
    params = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in expected_model_params(cfg, None).items() if shape is not None}
    sums = [np.full(p.shape, version, dtype=np.float32) for p in params.values()]
    return embeddings, ModelState(params, encode_adagrad(sums, lr=0.1, steps=version))


def metadata(cfg: ConfigSchema, iteration: int) -> FileMetadata:
    return FileMetadata(cfg.to_json(), IterationInfo(cfg.num_epochs, iteration, 1, 0, "edges/train", 1, 0))


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, ConfigSchema, dict[tuple[str, int], int]]:
    config_path = build_example(tmp_path / "layout", num_edges=200)
    cfg = load_config(config_path)
    counts = {("user", 0): 30, ("user", 1): 30, ("item", 0): 40}
    embeddings, model = states(cfg, 1, counts)
    write_checkpoint(CheckpointDir(tmp_path / "layout" / "checkpoint"), 1, embeddings=embeddings,
                     model=model, metadata=metadata(cfg, 0), config=cfg)
    return config_path, cfg, counts


def assert_loadable(ckpt: CheckpointDir, expected: dict[int, tuple[dict, ModelState]]) -> int:
    version = ckpt.read_version()
    embeddings, model = expected[version]
    for (etype, part), state in embeddings.items():
        loaded = ckpt.read_embeddings(etype, part)
        assert np.array_equal(loaded.embeddings, state.embeddings)
        assert loaded.optimizer_state == state.optimizer_state
    loaded_model = ckpt.read_model()
    assert loaded_model.params.keys() == model.params.keys()
    for name, value in model.params.items():
        assert np.array_equal(loaded_model.params[name], value)
    return version


def test_crash_between_any_two_steps_keeps_previous_version(layout, tmp_path: Path) -> None:
    config_path, cfg, counts = layout
    root = config_path.parent
    v1 = states(cfg, 1, counts)
    v2 = states(cfg, 2, counts)
    probe = CheckpointDir(root / "checkpoint")
    steps = commit_steps(probe, 2, embeddings=v2[0], model=v2[1], metadata=metadata(cfg, 1), config=cfg)
    commit_at = next(i for i, s in enumerate(steps) if s.description.startswith("commit"))
    assert len(steps) >= 6
    for crash_after in range(len(steps) + 1):
        trial = tmp_path / f"trial{crash_after}"
        shutil.copytree(root, trial, symlinks=True)
        ckpt = CheckpointDir(trial / "checkpoint")
        for step in commit_steps(ckpt, 2, embeddings=v2[0], model=v2[1], metadata=metadata(cfg, 1),
                                    config=cfg)[:crash_after]:
            step.run()
        version = assert_loadable(ckpt, {1: v1, 2: v2})
        assert version == (2 if crash_after > commit_at else 1), steps[crash_after - 1].description
        report = validate_path(trial / "config.json")
        assert report.ok, [str(i) for i in report.errors]
        if 0 < crash_after < len(steps):
            assert "checkpoint-stale-files" in report.rule_ids()
        if crash_after == len(steps):
            assert not report.issues, [str(i) for i in report.issues]
            assert ckpt.versions_on_disk() == [2]


def test_snapshot_keeps_its_version_alive(layout) -> None:
    config_path, cfg, counts = layout
    ckpt = CheckpointDir(config_path.parent / "checkpoint")
    v2, v3 = states(cfg, 2, counts), states(cfg, 3, counts)
    write_checkpoint(ckpt, 2, embeddings=v2[0], model=v2[1], metadata=metadata(cfg, 1), snapshot_epoch=1)
    write_checkpoint(ckpt, 3, embeddings=v3[0], model=v3[1], metadata=metadata(cfg, 2))
    assert ckpt.versions_on_disk() == [2, 3]
    snapshot = CheckpointDir(ckpt.path / "epoch_1")
    assert snapshot.read_version() == 2
    assert np.array_equal(snapshot.read_embeddings("item", 0).embeddings, v2[0][("item", 0)].embeddings)
    report = validate_path(config_path)
    assert report.ok and not report.issues, [str(i) for i in report.issues]


def test_superseded_files_stay_when_the_directory_changed_meanwhile(layout) -> None:
    """A run read version 1, then the directory was removed or moved on (another writer): it deletes
    nothing and says which, in a typed error a CLI prints as one line (CI once saw a RuntimeError)."""
    from pbgio.checkpoint import remove_superseded
    from pbgio.errors import CheckpointInUseError, MissingArtifactError

    config_path, cfg, counts = layout
    ckpt = CheckpointDir(config_path.parent / "checkpoint")
    v2 = states(cfg, 2, counts)
    write_checkpoint(ckpt, 2, embeddings=v2[0], model=v2[1], metadata=metadata(cfg, 1))
    ckpt.version_path.write_text("3\n")
    on_disk = sorted(p.name for p in ckpt.path.iterdir())
    with pytest.raises(CheckpointInUseError, match="says 3 where this run read 2"):
        remove_superseded(ckpt, 2)
    ckpt.version_path.unlink()
    with pytest.raises(MissingArtifactError, match="removed while the run started from version 2"):
        remove_superseded(ckpt, 2)
    assert sorted(p.name for p in ckpt.path.iterdir()) == [n for n in on_disk if n != ckpt.version_path.name]


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from pathlib import Path
    from pbgio.checkpoint import CheckpointDir, EmbeddingsState, ModelState, write_checkpoint
    ckpt = CheckpointDir(Path(sys.argv[1]))
    version = ckpt.read_version()
    while True:
        version += 1
        emb = np.full((200_000, 16), version, dtype=np.float32)
        write_checkpoint(ckpt, version, embeddings={("user", 0): EmbeddingsState(emb)},
                         model=ModelState({"entities/user/global_embedding": np.full(16, version, np.float32)}))
        print(version, flush=True)
""")


def test_kill_9_during_writes_leaves_a_loadable_version(tmp_path: Path) -> None:
    ckpt = CheckpointDir(tmp_path / "ckpt")
    rng = np.random.default_rng(0)
    for attempt in range(4):
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(ckpt.path)], stdout=subprocess.PIPE)
        assert child.stdout is not None
        child.stdout.readline()  # at least one version committed by this child
        time.sleep(float(rng.uniform(0.0, 0.3)))
        child.send_signal(signal.SIGKILL)
        child.wait()
        version = ckpt.read_version()
        assert version >= attempt + 1
        emb = ckpt.read_embeddings("user", 0).embeddings
        assert emb.shape == (200_000, 16) and (emb == version).all()
        assert (ckpt.read_model().params["entities/user/global_embedding"] == version).all()
        report = validate_path(ckpt.path)
        assert report.ok, [str(i) for i in report.errors]
