"""The legacy reference samples convert, validate clean and match their expected migration."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.edges import read_bucket
from pbgio.entities import read_entity_count, read_entity_names, read_relation_names
from pbgio.legacy.migrate import MigrationResult, migrate
from pbgio.legacy.planner import PLACEHOLDER_NAME
from pbgio.validate import validate_path
from tests.shared import SAMPLES

LEGACY = [c["name"] for c in json.loads((SAMPLES / "INDEX.json").read_text()) if c["kind"] == "legacy"]


def sha_f32(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<f4").tobytes()).hexdigest()


def sha_i64(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<i8").tobytes()).hexdigest()


def expected(name: str) -> dict[str, Any]:
    return json.loads((SAMPLES / name / "case.json").read_text())["details"]["expected_migration"]


@pytest.fixture(scope="module", params=LEGACY)
def converted(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, MigrationResult]:
    name = request.param
    dst = tmp_path_factory.mktemp(name) / "migrated"
    return name, dst, migrate(SAMPLES / name, dst)


def test_converts_and_validates_clean(converted: tuple[str, Path, MigrationResult]) -> None:
    _, dst, result = converted
    assert result.written and result.ok
    report = validate_path(dst)
    assert report.ok and not report.issues, [str(i) for i in report.issues]
    assert report.kind == "config"
    done = subprocess.run([sys.executable, "-m", "pbgio", "validate", str(dst)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_config_json_is_migrated_config_full(converted: tuple[str, Path, MigrationResult]) -> None:
    name, dst, _ = converted
    full = expected(name)["checkpoint"]["migrated_config_full"]
    for path in (dst / "config.json", dst / "checkpoint" / "config.json"):
        assert json.loads(path.read_text()) == full
        assert path.read_text() == json.dumps(full, indent=4)  # as the original writes it


def test_entity_counts_and_names(converted: tuple[str, Path, MigrationResult]) -> None:
    name, dst, result = converted
    exp = expected(name)
    entity_path = dst / json.loads((dst / "config.json").read_text())["entity_path"]
    for etype, counts in exp["entity_counts"].items():
        assert [read_entity_count(entity_path, etype, p) for p in range(len(counts))] == counts
    placeholders = 0
    for key, names in exp["entity_names_from_dict_pt"].items():
        etype, part = key.split("/")
        got = read_entity_names(entity_path, etype, int(part))
        assert len(got) == len(names)
        for offset, (want, have) in enumerate(zip(names, got, strict=True)):
            if want is None:  # the converter's padding row: a documented placeholder
                assert have == PLACEHOLDER_NAME.format(part=part, offset=offset)
                placeholders += 1
            else:
                assert have == want
    assert sum("placeholder" in w for w in result.plan.warnings) == (1 if placeholders else 0)
    assert read_relation_names(entity_path) == exp["relation_names_from_dict_pt"]


def test_edges_shifted(converted: tuple[str, Path, MigrationResult]) -> None:
    name, dst, _ = converted
    for edge_path, buckets in expected(name)["edges"].items():
        for key, want in buckets.items():
            lhs, rhs = map(int, key.split("_"))
            bucket = read_bucket(dst / edge_path / f"edges_{lhs}_{rhs}.h5")
            assert len(bucket) == want["count"]
            for side in ("lhs", "rhs", "rel"):
                values = getattr(bucket, side)
                assert sha_i64(values) == want[f"{side}_sha256_i64"]
                assert (values.min(), values.max()) == (want[f"{side}_min"], want[f"{side}_max"])


def test_embeddings_and_optimizer(converted: tuple[str, Path, MigrationResult]) -> None:
    import torch

    name, dst, _ = converted
    checkpoint = expected(name)["checkpoint"]
    ckpt = CheckpointDir(dst / "checkpoint")
    assert ckpt.read_version() == checkpoint["version"]
    for want in checkpoint["embeddings"]:
        state = ckpt.read_embeddings(want["type"], want["part"], want["version"])
        assert list(state.embeddings.shape) == want["shape"]
        assert sha_f32(state.embeddings) == want["sha256_f32"]
        assert state.optimizer_state is not None and state.optimizer_state[:4] == b"PK\x03\x04"
        opt = torch.load(io.BytesIO(state.optimizer_state), weights_only=True)
        assert set(opt["state"][0]) == {"sum"}  # the legacy 'step' int is dropped
        assert opt["state"][0]["sum"].shape == (want["shape"][0],)
        group = want["optimizer"]["param_groups"][0]
        assert opt["param_groups"] == [{"lr": group["lr"], "lr_decay": group["lr_decay"],
                                        "weight_decay": group["weight_decay"], "params": [0]}]


def test_model_params_transposed_where_needed(converted: tuple[str, Path, MigrationResult]) -> None:
    import h5py
    import torch

    name, dst, _ = converted
    checkpoint = expected(name)["checkpoint"]
    model = CheckpointDir(dst / "checkpoint").read_model()
    assert set(model.params) == set(checkpoint["model"])
    for public, want in checkpoint["model"].items():
        assert list(model.params[public].shape) == want["shape"]
        assert sha_f32(model.params[public]) == want["sha256_f32"], public
    with h5py.File(dst / "checkpoint" / f"model.v{checkpoint['version']}.h5") as f:
        for public, want in checkpoint["model"].items():
            assert f["model"][public].attrs["state_dict_key"] == want["state_dict_key"]
    assert model.optimizer_state is not None
    opt = torch.load(io.BytesIO(model.optimizer_state), weights_only=True)
    want_opt = checkpoint["model_optimizer"]["param_groups"][0]
    assert len(opt["state"]) == want_opt["n_params"] == len(model.params)
    assert opt["param_groups"][0]["params"] == list(range(len(model.params)))
    for i, value in enumerate(model.params.values()):  # state i follows parameter i, transposed with it
        assert tuple(opt["state"][i]["sum"].shape) == value.shape
        assert set(opt["state"][i]) == {"step", "sum"}


def test_rotation_sum_transposed_with_its_parameter() -> None:
    import torch

    from pbgio.legacy.pickles import load_pickle

    case = SAMPLES / "sample_legacy_camel_1based"
    _, _, _, state, optim = load_pickle(case / "checkpoint" / "METADATA_1.pt.1")
    keys = list(state)
    legacy_sum = optim["state"][keys.index("rhs_operators.1.rotation")]["sum"]
    from pbgio.legacy.reader import LegacyCheckpointDir

    model = LegacyCheckpointDir(case / "checkpoint").read_model()
    assert model.optimizer_state is not None
    opt = torch.load(io.BytesIO(model.optimizer_state), weights_only=True)
    index = list(model.params).index("relations/1/operator/rhs/linear_transformation")
    assert torch.equal(opt["state"][index]["sum"], legacy_sum.T)


def test_edges_name_the_training_triples() -> None:
    """Names from dict.pt plus the shifted edges give back the converter's input TSV."""
    from collections import Counter

    for name in LEGACY:
        case = SAMPLES / name
        dst_names: dict[tuple[str, int], list[str]] = {}
        from pbgio.legacy.reader import LegacyLayout

        layout = LegacyLayout.discover(case)
        entities, edges = layout.entity_dirs[0], layout.edge_dirs[0]
        for etype, parts in entities.types().items():
            for part in range(parts):
                dst_names[(etype, part)] = entities.read_entity_names(etype, part)  # type: ignore[assignment]
        config = layout.checkpoint_dirs[0].read_config()
        rel_names = entities.read_relation_names()
        assert rel_names is not None
        triples = Counter()
        for (lhs_part, rhs_part) in edges.bucket_files:
            bucket = edges.read_bucket(lhs_part, rhs_part)
            rows = zip(bucket.rel.tolist(), bucket.lhs.tolist(), bucket.rhs.tolist(), strict=True)
            for r, lhs, rhs in rows:
                rel = config.relations[r]
                lp = lhs_part if config.num_partitions(rel.lhs) > 1 else 0
                rp = rhs_part if config.num_partitions(rel.rhs) > 1 else 0
                triples[(dst_names[(rel.lhs, lp)][lhs], rel_names[r], dst_names[(rel.rhs, rp)][rhs])] += 1
        tsv = Counter(tuple(line.split()) for line in (case / "data" / "train.tsv").read_text().splitlines()
                      if line.strip())
        assert triples == tsv, name
