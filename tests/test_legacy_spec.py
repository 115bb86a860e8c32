"""Every key, value and parameter the original renamed maps to today's; the guide's tables stay in sync."""

from __future__ import annotations

import ast
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pbgio.config import ConfigSchema, EntitySchema, RelationSchema, key_case_issues, parse_config, snake_case_keys
from pbgio.errors import ConfigError, FormatError
from pbgio.legacy import spec as legacy_spec
from pbgio.legacy.reader import LegacyEdgeDir
from pbgio.legacy.spec import (
    CAMEL_KEYS,
    GENERATED_BLOCKS,
    KEY_RENAMES,
    LEGACY_DEFAULTS,
    LEGACY_PROBLEMS,
    PARAM_RENAMES,
    VALUE_RENAMES,
    migrate_config_dict,
    problems_markdown,
    renames_markdown,
    render_guide,
    snake,
)
from pbgio.legacy.state import migrate_embeddings_optimizer, migrate_model
from pbgio.spec import naming
from pbgio.spec.config_keys import mixed_case_to_snake_case

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "migration.md"
ORIGINAL = Path(__file__).resolve().parents[2] / "shared" / "reference" / "original"


def camel_config(**overrides: Any) -> dict[str, Any]:
    """A 0035569-era stored config (like the camelCase sample's METADATA)."""
    config: dict[str, Any] = {
        "model": "f2_model", "dimension": 4,
        "relations": [{"name": "r", "lhs": "a", "rhs": "a", "weight": 1.0, "operator": "none",
                       "all_rhs_negs": 0}],
        "entities": {"a": {"numPartitions": 1, "featurized": 0}},
        "metric": "cos", "lossFn": "ranking", "bias": 0, "globalEmb": 1, "maxNorm": None, "margin": 0.1,
        "initScale": 0.001, "entityPath": "data", "edgePaths": ["edges"], "outdir": "ckpt", "loadPath": None,
        "batchSize": 20, "workers": 1, "lr": 0.01, "numEpochs": 1, "numEdgeChunks": 1, "numUniformNegs": 5,
        "numBatchNegs": 5, "partitionOrder": "inside_out", "evalFraction": 0.0, "evalNumUniformNegs": 1000,
        "evalNumBatchNegs": 1000, "background_io": 0, "verbose": 1, "hogwild_delay": 0, "numDynamicRels": 0,
        "numMachines": 1, "numPartitionServers": -1, "distributedInitMethod": None,
        "distributedTreeInitOrder": 1,
    }
    config.update(overrides)
    return config


def migrated(config: dict[str, Any]) -> ConfigSchema:
    return parse_config(migrate_config_dict(config).config)


KEY_CASES: dict[str, tuple[dict[str, Any], str, Any]] = {
    # legacy key: (overrides, current key path, expected current value)
    "outdir": ({"outdir": "model/ckpt"}, "checkpoint_path", "model/ckpt"),
    "loadPath": ({"loadPath": "init"}, "init_path", "init"),
    "metric": ({"metric": "dot"}, "comparator", "dot"),
    "partitionOrder": ({"partitionOrder": "outside_in"}, "bucket_order", "outside_in"),
    "all_rhs_negs": ({"relations": [{"name": "r", "lhs": "a", "rhs": "a", "operator": "none",
                                     "all_rhs_negs": 1}]}, "relations.0.all_negs", True),
    "model": ({"model": "f2_model"}, "model", None),
    "numDynamicRels": ({"numDynamicRels": 7, "globalEmb": 0}, "dynamic_relations", True),
}


def lookup(config: ConfigSchema, path: str) -> Any:
    value: Any = config.to_dict()
    for part in path.split("."):
        value = value[int(part)] if part.isdigit() else value.get(part)
    return value


def test_every_key_rename_has_a_case() -> None:
    assert {r.legacy for r in KEY_RENAMES} == set(KEY_CASES)


@pytest.mark.parametrize("legacy_key", sorted(KEY_CASES))
@pytest.mark.parametrize("spelling", ["camel", "snake"])
def test_key_rename(legacy_key: str, spelling: str) -> None:
    overrides, path, value = KEY_CASES[legacy_key]
    config = camel_config(**overrides)
    if spelling == "snake":  # the same key as the snake_case era (or the loader's case conversion) spells it
        config = {snake(k): v for k, v in config.items()}
        config["relations"] = [{snake(k): v for k, v in r.items()} for r in config["relations"]]
        config["entities"] = {t: {snake(k): v for k, v in e.items()} for t, e in config["entities"].items()}
    result = migrate_config_dict(config)
    cfg = parse_config(result.config)
    assert lookup(cfg, path) == value
    assert legacy_key not in result.config and snake(legacy_key) not in result.config
    assert any(c.legacy_key in (legacy_key, snake(legacy_key)) for c in result.changes)
    if legacy_key == "numDynamicRels":
        assert result.num_dynamic_rels == 7
        assert not migrated(camel_config(numDynamicRels=0)).dynamic_relations


VALUE_CASES = {
    "chained_symmetric_pairs": ({"partitionOrder": "chained_symmetric_pairs"}, "bucket_order", "affinity"),
    "affine_rhs": ({"relations": [{"name": "r", "lhs": "a", "rhs": "a", "operator": "AFFINE_RHS"}]},
                   "relations.0.operator", "affine"),
    "logit": ({"lossFn": "logit", "metric": "dot"}, "loss_fn", "logistic"),
}


def test_every_value_rename_has_a_case() -> None:
    assert {v.legacy for v in VALUE_RENAMES} == set(VALUE_CASES)


@pytest.mark.parametrize("legacy_value", sorted(VALUE_CASES))
def test_value_rename(legacy_value: str) -> None:
    overrides, path, value = VALUE_CASES[legacy_value]
    assert lookup(migrated(camel_config(**overrides)), path) == value


def test_camel_keys_only_change_case() -> None:
    known = set(ConfigSchema.model_fields) | set(EntitySchema.model_fields) | set(RelationSchema.model_fields)
    assert {snake(k) for k in CAMEL_KEYS} <= known
    cfg = migrated(camel_config())
    assert cfg.entity_path == "data" and cfg.edge_paths == ["edges"] and cfg.num_partitions("a") == 1
    assert cfg.global_emb is True and cfg.bias is False and cfg.hogwild_delay == 0.0
    assert cfg.distributed_tree_init_order is True and cfg.init_scale == 0.001


def test_legacy_defaults_fill_missing_keys_only() -> None:
    assert set(LEGACY_DEFAULTS) <= set(ConfigSchema.model_fields)
    minimal = {k: v for k, v in camel_config().items() if k not in ("workers", "verbose", "numEdgeChunks")}
    cfg = migrated(minimal)
    assert (cfg.workers, cfg.verbose, cfg.num_edge_chunks) == (40, 1, 1)
    assert migrated(camel_config(workers=3)).workers == 3


def test_conflicting_and_unknown_keys_are_errors() -> None:
    with pytest.raises(FormatError, match="legacy-config"):
        migrate_config_dict(camel_config(comparator="dot"))  # both metric and comparator
    with pytest.raises(ConfigError, match=r"unknown key 'num_epoch' \(did you mean 'num_epochs'"):
        migrated(camel_config(numEpoch=3))


# --------------------------------------------------------------------------- one key converter, one bucket pattern

# The original's torchbiggraph/schema.py:47 (mixed_case_to_lowercase), worked out by hand:
# every character for which str.isupper holds becomes "_" + its lowercase.
ORIGINAL_CONVERSIONS = {
    "lhsID": "lhs_i_d", "numEpochs": "num_epochs", "entityPath": "entity_path", "edgePaths": "edge_paths",
    "numDynamicRels": "num_dynamic_rels", "evalNumUniformNegs": "eval_num_uniform_negs",
    "distributedTreeInitOrder": "distributed_tree_init_order", "loadPath": "load_path", "outdir": "outdir",
    "all_rhs_negs": "all_rhs_negs", "NumEpochs": "_num_epochs", "maxNorm2D": "max_norm2_d", "ÉtéX": "_été_x",
}


def original_converter() -> Callable[[str], str] | None:
    """The original's own ``mixed_case_to_lowercase``, taken from the wheel in ../shared (None without it):
    only that function is compiled, so none of the original's dependencies is needed."""
    wheels = sorted(ORIGINAL.glob("torchbiggraph-*.whl"))
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[0]) as wheel:
        source = wheel.read("torchbiggraph/schema.py").decode("utf-8")
    [function] = [node for node in ast.parse(source).body
                  if isinstance(node, ast.FunctionDef) and node.name == "mixed_case_to_lowercase"]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module([function], type_ignores=[]), "torchbiggraph/schema.py", "exec"), namespace)
    converter: Callable[[str], str] = namespace["mixed_case_to_lowercase"]
    return converter


CONVERTED_KEYS = sorted({*ORIGINAL_CONVERSIONS, *CAMEL_KEYS, *(r.legacy for r in KEY_RENAMES)})


def test_the_key_converter_is_the_originals() -> None:
    for key, expected in ORIGINAL_CONVERSIONS.items():
        assert mixed_case_to_snake_case(key) == expected, key
    original = original_converter()
    if original is None:
        pytest.skip(f"the original's wheel is not in {ORIGINAL}")
    assert {k: mixed_case_to_snake_case(k) for k in CONVERTED_KEYS} == {k: original(k) for k in CONVERTED_KEYS}
    assert {k: original(k) for k in ORIGINAL_CONVERSIONS} == ORIGINAL_CONVERSIONS


def test_every_key_conversion_is_the_one_converter() -> None:
    assert snake is mixed_case_to_snake_case
    legacy = migrate_config_dict({"lhsID": 1, "entities": {"userId": {"numPartitions": 1}},
                                  "relations": [{"name": "r", "allNegs": 1}]})
    current = snake_case_keys({"lhsID": 1, "entities": {"userId": {"numPartitions": 1}},
                               "relations": [{"name": "r", "allNegs": 1}]})
    for config in (legacy.config, current):
        assert "lhs_i_d" in config and "lhs_id" not in config
        assert config["entities"] == {"userId": {"num_partitions": 1}}
        assert config["relations"] == [{"name": "r", "all_negs": 1}]
    assert legacy.era == "camelCase"
    assert any(c.legacy_key == "lhsID" and c.current_key == "lhs_i_d" for c in legacy.changes)
    [issue] = key_case_issues({"lhsID": 1})
    assert "read as 'lhs_i_d'" in issue.message


NON_ASCII_DIGITS = ["\u0663", "\uff11", "\u0967"]  # Arabic-Indic three, fullwidth one, Devanagari one


@pytest.mark.parametrize("digit", NON_ASCII_DIGITS, ids=["arabic-indic", "fullwidth", "devanagari"])
def test_file_names_with_non_ascii_digits_are_not_layout_files(digit: str, tmp_path: Path) -> None:
    assert int(digit) >= 0  # a digit to Python's int(), and to the regex \d
    assert naming.BUCKET_RE is legacy_spec.BUCKET_RE  # one declaration for both layouts
    for parse in (naming.parse_bucket_file, legacy_spec.parse_bucket_file):
        assert parse("edges_0_1.h5") == (0, 1)
        for name in (f"edges_{digit}_0.h5", f"edges_0_{digit}.h5", f"edges_1{digit}_0.h5"):
            assert parse(name) is None, name
    assert legacy_spec.parse_entity_count_file(f"entity_count_user_{digit}.pt") is None
    assert legacy_spec.parse_embeddings_file(f"user_{digit}.pt") is None
    assert legacy_spec.parse_embeddings_file(f"user_1.pt.{digit}") is None
    assert legacy_spec.parse_metadata_file(f"METADATA_1.pt.{digit}") is None
    assert legacy_spec.migrate_param_key(f"rhs_operators.{digit}.rotation") == (f"rhs_operators.{digit}.rotation",
                                                                                 False)
    for name in ("edges_0_0.h5", f"edges_{digit}_0.h5"):
        (tmp_path / name).write_bytes(b"")
    assert list(LegacyEdgeDir(tmp_path).bucket_files) == [(0, 0)]


@pytest.mark.parametrize("rename", PARAM_RENAMES, ids=lambda r: r.legacy)
def test_param_rename_transposes(rename: Any) -> None:
    dynamic = rename.legacy.endswith("s")
    shape = (3, 4, 4) if dynamic else (4, 4)
    value = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
    key = f"rhs_operators.0.{rename.legacy}"
    optimizer = {"state": {0: {"step": torch.tensor(2.0), "sum": value * 2}},
                 "param_groups": [{"lr": 0.1, "params": [0]}]}
    model = migrate_model({key: value}, optimizer, None, "METADATA_1.pt")
    public = f"relations/0/operator/rhs/{rename.current}"
    assert list(model.params) == [public]
    np.testing.assert_array_equal(model.params[public], np.swapaxes(value.numpy(), -1, -2))
    assert model.optimizer is not None
    assert torch.equal(model.optimizer["state"][0]["sum"], (value * 2).transpose(-1, -2))
    x = torch.randn(4)
    old = x @ value[0] if dynamic else x @ value  # the legacy affine: x @ R
    new = torch.from_numpy(model.params[public][0] if dynamic else model.params[public]) @ x  # today: W @ x
    torch.testing.assert_close(old, new)


def test_model_order_and_optimizer_follow_todays_parameter_order() -> None:
    cfg = migrated(camel_config(
        entities={"b": {"numPartitions": 1}, "a": {"numPartitions": 1}},
        relations=[{"name": "r", "lhs": "a", "rhs": "b", "operator": "affine_rhs"}]))
    legacy = {  # as torch 1.0 stored it: ParameterDict keys sorted, affine's translation first
        "global_embs.emb_a": torch.zeros(4), "global_embs.emb_b": torch.ones(4),
        "rhs_operators.0.translation": torch.full((4,), 2.0), "rhs_operators.0.rotation": torch.eye(4) * 3,
    }
    optimizer = {"state": {i: {"sum": v + 10} for i, v in enumerate(legacy.values())},
                 "param_groups": [{"lr": 0.1, "params": [0, 1, 2, 3]}]}
    model = migrate_model(legacy, optimizer, cfg, "METADATA_1.pt")
    assert list(model.params) == ["relations/0/operator/rhs/linear_transformation",
                                  "relations/0/operator/rhs/translation",
                                  "entities/b/global_embedding", "entities/a/global_embedding"]
    assert model.optimizer is not None
    for i, value in enumerate(model.params.values()):
        np.testing.assert_array_equal(model.optimizer["state"][i]["sum"].numpy(), value + 10)
    assert model.optimizer["param_groups"][0]["params"] == [0, 1, 2, 3]


def test_row_adagrad_step_is_dropped_sum_kept() -> None:
    state = {"state": {0: {"step": 5, "sum": torch.ones(3)}},
             "param_groups": [{"lr": 0.01, "lr_decay": 0, "weight_decay": 0, "params": [0]}]}
    out = migrate_embeddings_optimizer(state, "user_1.pt")
    assert out is not None and list(out["state"][0]) == ["sum"]
    assert torch.equal(out["state"][0]["sum"], torch.ones(3))
    assert out["param_groups"] == state["param_groups"]
    assert migrate_embeddings_optimizer(None, "user_1.pt") is None


# --------------------------------------------------------------------------- the migration guide


def test_guide_holds_the_generated_tables() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    for name in GENERATED_BLOCKS:
        assert re.search(rf"<!-- BEGIN {name}[^>]*-->\n.*?<!-- END {name} -->", text, re.S), name
    assert renames_markdown() in text and problems_markdown() in text
    assert render_guide(text) == text, "regenerate with: python tools/gen_migration_guide.py"


def test_guide_names_every_problem_code_and_decision() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    for code in LEGACY_PROBLEMS:
        assert f"`{code}`" in text, code
    for phrase in ("--trust-pickle", "--dry-run", "--force", "__pbgio_unnamed_", "step", "weights_only"):
        assert phrase in text, phrase
