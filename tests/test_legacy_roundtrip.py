"""Random legacy layouts survive the migration value for value (hypothesis + a test-only legacy writer)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pbgio.checkpoint import CheckpointDir
from pbgio.config import load_config, parse_config
from pbgio.edges import read_bucket
from pbgio.entities import read_dynamic_rel_count, read_entity_count, read_entity_names, read_relation_names
from pbgio.legacy.migrate import migrate
from pbgio.legacy.planner import PLACEHOLDER_NAME
from pbgio.testing.legacy_layouts import LegacySpec, LegacyTruth, write_legacy_layout
from pbgio.validate import validate_path

OPERATORS = ("none", "diagonal", "translation", "linear", "affine", "complex_diagonal")

legacy_specs = st.builds(
    LegacySpec,
    seed=st.integers(0, 2**16),
    index_base=st.sampled_from([0, 1]),
    camel=st.booleans(),
    zip_container=st.booleans(),
    version=st.integers(0, 3),
    version_file=st.booleans(),
    dynamic=st.sampled_from(["none", "count", "bool"]),
    num_partitions=st.integers(1, 3),
    num_users=st.integers(1, 10),
    num_items=st.integers(1, 5),
    featurized=st.booleans(),
    dimension=st.sampled_from([2, 4]),
    edges_per_bucket=st.integers(0, 12),
    operators=st.lists(st.sampled_from(OPERATORS), min_size=1, max_size=3).map(tuple),
    rotation=st.booleans(),
    global_emb=st.booleans(),
    dictionary=st.booleans(),
    optimizer=st.booleans(),
    absolute_paths=st.booleans(),
    chained_symmetric_pairs=st.booleans(),
    shuffle_state_dict=st.booleans(),
    num_edge_chunks=st.integers(1, 3),
    init_dir=st.booleans(),
)


def tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def check_migrated(dst: Path, truth: LegacyTruth, spec: LegacySpec) -> None:
    import torch

    report = validate_path(dst)
    assert report.ok, [str(i) for i in report.errors]
    # v0 files only; and uniform negatives beside a featurized type, kept as the legacy trainer ran them
    expected = {"checkpoint-attrs"} | ({"config-featurized-uniform-negs"} if spec.featurized else set())
    assert report.rule_ids() <= expected, [str(i) for i in report.issues]
    if "checkpoint-attrs" in report.rule_ids():
        assert truth.version == 0 or spec.init_dir
    # config
    expected = parse_config(truth.config).to_dict()
    assert load_config(dst / "config.json").to_dict() == expected
    assert load_config(dst / "checkpoint" / "config.json").to_dict() == expected
    # entities
    entities = dst / "data" / "entities"
    for (etype, part), count in truth.counts.items():
        assert read_entity_count(entities, etype, part) == count
    for (etype, part), names in truth.names.items():
        want = [n if n is not None else PLACEHOLDER_NAME.format(part=part, offset=i)
                for i, n in enumerate(names)]
        assert read_entity_names(entities, etype, part) == want
    if truth.relation_names is not None:
        assert read_relation_names(entities) == truth.relation_names
    if truth.dynamic_rel_count is not None:
        assert read_dynamic_rel_count(entities) == truth.dynamic_rel_count
    # edges
    buckets = sorted(p.name for p in (dst / "data" / "train_partitioned").iterdir())
    assert buckets == sorted(f"edges_{lhs}_{rhs}.h5" for lhs, rhs in truth.edges)
    for (lhs, rhs), edges in truth.edges.items():
        assert read_bucket(dst / "data" / "train_partitioned" / f"edges_{lhs}_{rhs}.h5") == edges
    # checkpoint
    ckpt = CheckpointDir(dst / "checkpoint")
    assert ckpt.read_version() == truth.version
    for key, embeddings in truth.embeddings.items():
        state = ckpt.read_embeddings(*key, truth.version)
        np.testing.assert_array_equal(state.embeddings, embeddings)
        want_sum = truth.embedding_sums[key]
        if want_sum is None:
            assert state.optimizer_state is None
        else:
            assert state.optimizer_state is not None
            opt = torch.load(io.BytesIO(state.optimizer_state), weights_only=True)
            assert list(opt["state"][0]) == ["sum"]
            np.testing.assert_array_equal(opt["state"][0]["sum"].numpy(), want_sum)
            assert opt["param_groups"] == [{"lr": 0.01, "lr_decay": 0, "weight_decay": 0, "params": [0]}]
    model = ckpt.read_model(truth.version)
    assert set(model.params) == set(truth.model)
    for name, value in truth.model.items():
        np.testing.assert_array_equal(model.params[name], value, err_msg=name)
    if truth.model_sums is None:
        assert model.optimizer_state is None
    else:
        assert model.optimizer_state is not None
        opt = torch.load(io.BytesIO(model.optimizer_state), weights_only=True)
        assert opt["param_groups"][0]["params"] == list(range(len(truth.model)))
        for i, name in enumerate(truth.model):  # today's parameter order
            np.testing.assert_array_equal(opt["state"][i]["sum"].numpy(), truth.model_sums[name],
                                          err_msg=name)
            assert "step" in opt["state"][i]
    if spec.init_dir:
        init = CheckpointDir(dst / "init")
        for key, embeddings in truth.init_embeddings.items():
            state = init.read_embeddings(*key, 0)
            np.testing.assert_array_equal(state.embeddings, embeddings)
            assert state.optimizer_state is None


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=legacy_specs)
def test_random_legacy_layouts_round_trip(spec: LegacySpec, tmp_path_factory: pytest.TempPathFactory) -> None:
    work = tmp_path_factory.mktemp("roundtrip")
    truth = write_legacy_layout(work / "legacy", spec)
    before = tree_digest(work / "legacy")
    result = migrate(work / "legacy", work / "migrated")
    assert result.written and result.ok
    assert tree_digest(work / "legacy") == before  # SRC is never written to
    variant = result.plan.variant
    assert variant.index_bases == (spec.index_base,)
    assert variant.config_era == ("camelCase" if spec.camel else "snake_case")
    assert variant.version_file == ("CHECKPOINT_VERSION" if spec.version_file else None)
    assert set(variant.containers) == {"zip" if spec.zip_container else "legacy"}
    assert variant.dynamic_relations == (spec.dynamic != "none")
    check_migrated(work / "migrated", truth, spec)


@pytest.mark.parametrize("spec", [
    LegacySpec(seed=11, camel=True, index_base=1, operators=("affine", "linear", "translation")),
    LegacySpec(seed=12, camel=False, index_base=0, zip_container=True, rotation=False,
               operators=("diagonal", "complex_diagonal")),
    LegacySpec(seed=13, dynamic="count", operators=("affine",), featurized=True),
    LegacySpec(seed=14, version=0, version_file=False, init_dir=True, absolute_paths=True),
    LegacySpec(seed=15, version=3, num_edge_chunks=2, chained_symmetric_pairs=True, num_partitions=3),
], ids=["camel-1based", "snake-0based-zip", "dynamic-featurized", "init-layout", "v3-chunks"])
def test_named_variants_round_trip(spec: LegacySpec, tmp_path: Path) -> None:
    truth = write_legacy_layout(tmp_path / "legacy", spec)
    result = migrate(tmp_path / "legacy", tmp_path / "migrated")
    assert result.ok
    check_migrated(tmp_path / "migrated", truth, spec)


def test_a_lone_init_directory_converts_without_config(tmp_path: Path) -> None:
    """A loadPath directory by itself: {type}_{part}.pt without suffix, no version file, no METADATA."""
    truth = write_legacy_layout(tmp_path / "run", LegacySpec(seed=3, init_dir=True))
    result = migrate(tmp_path / "run" / "init", tmp_path / "init")
    assert result.ok and result.plan.config is None
    assert result.plan.variant.init_layout and result.plan.variant.version_file is None
    init = CheckpointDir(tmp_path / "init")
    assert init.read_version() == 0 and not (tmp_path / "init" / "config.json").exists()
    for key, embeddings in truth.init_embeddings.items():
        np.testing.assert_array_equal(init.read_embeddings(*key, 0).embeddings, embeddings)
    assert validate_path(tmp_path / "init").ok


def test_data_without_checkpoint_converts_without_config(tmp_path: Path) -> None:
    truth = write_legacy_layout(tmp_path / "run", LegacySpec(seed=4, index_base=1))
    result = migrate(tmp_path / "run" / "data", tmp_path / "data")
    assert result.ok and result.plan.config is None
    assert sorted(result.plan.migrated_dirs) == ["entities", "train_partitioned"]
    for (lhs, rhs), edges in truth.edges.items():
        assert read_bucket(tmp_path / "data" / "train_partitioned" / f"edges_{lhs}_{rhs}.h5") == edges
    for (etype, part), count in truth.counts.items():
        assert read_entity_count(tmp_path / "data" / "entities", etype, part) == count
    assert not (tmp_path / "data" / "config.json").exists()


def test_filament_version_file_and_empty_version_file(tmp_path: Path) -> None:
    """The version file's first name (until 9e6a290) is read too."""
    truth = write_legacy_layout(tmp_path / "legacy", LegacySpec(seed=6, version=2))
    ckpt = tmp_path / "legacy" / "checkpoint"
    (ckpt / "CHECKPOINT_VERSION").rename(ckpt / "FILAMENT_CHECKPOINT_VERSION")
    result = migrate(tmp_path / "legacy", tmp_path / "migrated")
    assert result.ok and result.plan.variant.version_file == "FILAMENT_CHECKPOINT_VERSION"
    assert CheckpointDir(tmp_path / "migrated" / "checkpoint").read_version() == truth.version == 2


def test_interim_run_with_1_based_data_and_0_based_checkpoint(tmp_path: Path) -> None:
    """960c530..eda73ff autodetected the base per file set: old data could meet a new checkpoint."""
    import re

    spec = LegacySpec(seed=9, index_base=1, camel=False)
    truth = write_legacy_layout(tmp_path / "legacy", spec)
    ckpt = tmp_path / "legacy" / "checkpoint"
    for path in sorted(ckpt.iterdir()):
        m = re.match(r"^(METADATA|user|item)_(\d+)(\.pt.*)$", path.name)
        if m:
            path.rename(ckpt / f"{m[1]}_{int(m[2]) - 1}{m[3]}")
    result = migrate(tmp_path / "legacy", tmp_path / "migrated")
    assert result.ok and result.plan.variant.index_bases == (0, 1)
    check_migrated(tmp_path / "migrated", truth, spec)


def test_a_checkpoint_alone_keeps_the_data_paths(tmp_path: Path) -> None:
    write_legacy_layout(tmp_path / "run", LegacySpec(seed=8))
    result = migrate(tmp_path / "run" / "checkpoint", tmp_path / "ckpt")
    assert result.ok and result.plan.unmigrated_paths == {"data/entities", "data/train_partitioned"}
    assert sum("is not inside SRC" in w for w in result.plan.warnings) == 2
    assert validate_path(tmp_path / "ckpt").rule_ids() == {"path-missing"}  # the data was not in SRC
    assert load_config(tmp_path / "ckpt" / "config.json").checkpoint_path == "."


def test_plan_json_is_serializable(tmp_path: Path) -> None:
    write_legacy_layout(tmp_path / "legacy", LegacySpec(seed=2))
    result = migrate(tmp_path / "legacy", tmp_path / "out", dry_run=True)
    data = json.loads(json.dumps(result.plan.to_dict()))
    assert data["variant"]["index_bases"] == [1] and data["steps"]
    assert not (tmp_path / "out").exists()
