"""Real files written by the original PyTorch-BigGraph read back exactly and validate clean."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.config import load_config
from pbgio.edges import read_bucket
from pbgio.entities import read_dynamic_rel_count, read_entity_count, read_entity_names, read_relation_names
from pbgio.validate import validate_path
from tests.shared import SAMPLES

INDEX = json.loads((SAMPLES / "INDEX.json").read_text())
CURRENT = [c["name"] for c in INDEX if c["kind"] == "current"]
LEGACY = [c["name"] for c in INDEX if c["kind"] == "legacy"]


def sha_f32(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<f4").tobytes()).hexdigest()


def sha_i64(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<i8").tobytes()).hexdigest()


def case(name: str) -> dict:
    return json.loads((SAMPLES / name / "case.json").read_text())


@pytest.mark.parametrize("name", CURRENT)
def test_current_sample_validates_clean(name: str) -> None:
    report = validate_path(SAMPLES / name)
    assert report.ok, [str(i) for i in report.issues]
    assert not report.issues, [str(i) for i in report.issues]
    assert report.kind == "config"


@pytest.mark.parametrize("name", CURRENT)
def test_current_sample_cli_exit_zero(name: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pbgio", "validate", str(SAMPLES / name), "--json"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["valid"] is True


@pytest.mark.parametrize("name", CURRENT)
def test_current_sample_reads_back_exactly(name: str) -> None:
    details = case(name)["details"]
    root = SAMPLES / name
    cfg = load_config(root / "checkpoint" / "config.json")
    entity_path = root / details["layout"]["entity_path"]
    for etype, counts in details["summary"]["entity_counts"].items():
        assert [read_entity_count(entity_path, etype, p) for p in range(len(counts))] == counts
    for key, expected in details.get("entity_names", {}).items():
        etype, part = key.split("/")
        names = read_entity_names(entity_path, etype, int(part))
        assert len(names) == expected["len"] and names[:3] == expected["first"]
    if cfg.dynamic_relations:
        assert read_dynamic_rel_count(entity_path) == details["dynamic_rel_count"]
        assert read_relation_names(entity_path) == details["dynamic_rel_names"]
    for edge_path, buckets in details["edges"].items():
        for bucket_key, facts in buckets.items():
            lhs, rhs = bucket_key.split("_")
            bucket = read_bucket(root / edge_path / f"edges_{lhs}_{rhs}.h5")
            assert len(bucket) == facts["count"]
            for dataset, info in facts["datasets"].items():
                if dataset.endswith("_offsets") or dataset.endswith("_data"):
                    side = dataset[:3]
                    feats = bucket.features(side)  # type: ignore[arg-type]
                    assert feats is not None
                    values = feats.offsets if dataset.endswith("_offsets") else feats.data
                else:
                    values = getattr(bucket, dataset)
                assert sha_i64(values) == info["sha256_i64"], dataset
    ckpt = CheckpointDir(root / details["layout"]["checkpoint_path"])
    assert ckpt.read_version() == details["checkpoint"]["version"]
    for emb in details["checkpoint"]["embeddings"]:
        state = ckpt.read_embeddings(emb["type"], emb["part"], emb["version"])
        assert state.embeddings.dtype == np.float32
        assert list(state.embeddings.shape) == emb["shape"]
        assert sha_f32(state.embeddings) == emb["sha256_f32"]
        blob = emb["optimizer_state_dict"]
        assert state.optimizer_state is not None
        assert len(state.optimizer_state) == blob["nbytes"]
        assert hashlib.sha256(state.optimizer_state).hexdigest() == blob["sha256"]
    for version, params in details["summary"]["model_params"].items():
        model = ckpt.read_model(int(version))
        for name, facts in params.items():
            value = model.params[name.removeprefix("model/")]
            assert list(value.shape) == facts["shape"]
            assert sha_f32(value) == facts["sha256_f32"]
        meta = ckpt.read_metadata(ckpt.model_path(int(version)))
        assert meta.config_json is not None and json.loads(meta.config_json) == cfg.to_dict()


@pytest.mark.parametrize("name", CURRENT)
def test_current_sample_config_json_round_trips_byte_for_byte(name: str) -> None:
    path = SAMPLES / name / "checkpoint" / "config.json"
    assert load_config(path).to_json() == path.read_text()


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_sample_is_recognized(name: str) -> None:
    report = validate_path(SAMPLES / name)
    assert report.kind == "legacy"
    assert report.rule_ids() == {"legacy-layout"}
    assert "pbgio convert --from legacy" in report.issues[0].message
