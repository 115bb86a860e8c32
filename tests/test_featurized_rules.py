"""Seed 002's negative sampling for featurized entity types, and unused feature datasets.

Featurized types take same-batch negatives only. What the original cannot run is an error: a
featurized side (negatives enabled) with all_negs, or with 0 batch negatives (the original then
samples uniformly, which a featurized type cannot). What it runs differently than one may think
is a warning: uniform negatives are skipped on a featurized side (plain sides keep theirs).
Feature datasets on a side where no relation is featurized are reported as ignored data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pbgio.config import ConfigSchema, parse_config, semantic_issues
from pbgio.errors import ConfigError
from pbgio.spec import naming
from pbgio.spec.rules import RULES
from pbgio.testing.layouts import write_layout
from pbgio.testing.mutations import LAYOUTS, MUTATORS
from pbgio.validate import validate_path

FEATURIZED_RULES = ("config-featurized-uniform-negs", "config-featurized-batch-negs",
                    "config-featurized-all-negs")

# A featurized type 'doc' beside a plain type 'author', valid under the featurized-entity rules
# (docs/guides/featurized.md).
BASE: dict[str, Any] = {
    "entities": {"author": {"num_partitions": 1}, "doc": {"num_partitions": 1, "featurized": True}},
    "relations": [{"name": "reads", "lhs": "author", "rhs": "doc"},
                  {"name": "follows", "lhs": "author", "rhs": "author"}],
    "dimension": 4, "entity_path": "entities", "edge_paths": ["edges"], "checkpoint_path": "ckpt",
    "num_uniform_negs": 0, "eval_num_uniform_negs": 0,
}


def _config(**changes: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(BASE))
    data.update(changes)
    return data


def _featurized_issues(data: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    """The featurized rules' issues, without parse_config raising on them."""
    schema = ConfigSchema.model_validate(data)
    return [(i.rule, i.dataset, i.message) for i in semantic_issues(schema) if i.rule in FEATURIZED_RULES]


def test_the_rules_are_catalogued_in_the_config() -> None:
    assert [RULES[r].severity for r in FEATURIZED_RULES] == ["warning", "error", "error"]
    assert {RULES[r].artifact for r in FEATURIZED_RULES} == {"config"}
    assert (RULES["edge-features-unused"].severity, RULES["edge-features-unused"].artifact) == \
        ("warning", "edges")


def test_a_valid_featurized_config_loads() -> None:
    cfg = parse_config(_config())
    assert cfg.featurized_types() == ["doc"]
    assert _featurized_issues(_config()) == []


def test_featurized_types_are_sorted_names() -> None:
    data = _config(entities={"z": {"num_partitions": 1, "featurized": True}, "a": {"num_partitions": 1},
                             "m": {"num_partitions": 2, "featurized": True}},
                   relations=[{"name": "r", "lhs": "z", "rhs": "m"}, {"name": "s", "lhs": "a", "rhs": "a"}])
    assert parse_config(data).featurized_types() == ["m", "z"]


@pytest.mark.parametrize(("changes", "rule_id", "path", "found"), [
    ({"num_batch_negs": 0, "num_uniform_negs": 10}, "config-featurized-batch-negs", "num_batch_negs", "found 0"),
    ({"relations": [{"name": "reads", "lhs": "author", "rhs": "doc", "all_negs": True}]},
     "config-featurized-all-negs", "relations[0].all_negs", "found true"),
    ({"relations": [{"name": "follows", "lhs": "author", "rhs": "author"},
                    {"name": "cites", "lhs": "doc", "rhs": "author", "all_negs": True}]},
     "config-featurized-all-negs", "relations[1].all_negs", "found true"),
])
def test_what_the_original_cannot_run_is_a_load_error_naming_key_and_type(
        changes: dict[str, Any], rule_id: str, path: str, found: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_config(**changes))
    issues = [i for i in info.value.issues if i.rule == rule_id]
    assert len(issues) == 1, [str(i) for i in info.value.issues]
    issue = issues[0]
    assert issue.severity == "error"
    assert issue.dataset == path
    assert issue.message.startswith("expected ")
    assert issue.message.endswith(found)
    assert "'doc'" in issue.message and "featurized" in issue.message
    assert path in str(info.value)


@pytest.mark.parametrize("changes", [
    {"disable_rhs_negs": True, "relations": [{"name": "reads", "lhs": "author", "rhs": "doc", "all_negs": True}]},
    {"disable_rhs_negs": True, "num_batch_negs": 0, "num_uniform_negs": 10},
])
def test_a_featurized_side_without_negatives_needs_none(changes: dict[str, Any]) -> None:
    # doc is only ever on the rhs, whose negatives are disabled: the original runs these
    assert _featurized_issues(_config(**changes)) == []


def test_uniform_negatives_are_a_warning_saying_what_happens() -> None:
    data = _config(num_uniform_negs=50)
    cfg = parse_config(data)  # the original trains it: accepted
    [(rule_id, path, message)] = _featurized_issues(data)
    assert (rule_id, path) == ("config-featurized-uniform-negs", "num_uniform_negs")
    assert message == ("num_uniform_negs=50 to train, but the rhs type 'doc' of relation 'reads' is featurized: it "
                       "takes same-batch negatives only (its uniform negatives are skipped, as in the original); "
                       "plain sides take their 50 uniform negatives")
    assert cfg.num_uniform_negs == 50


def test_evaluation_with_uniform_negatives_warns_once() -> None:
    data = _config(eval_fraction=0.1, eval_num_uniform_negs=100)
    parse_config(data)
    [(rule_id, path, message)] = _featurized_issues(data)
    assert (rule_id, path) == ("config-featurized-uniform-negs", "eval_num_uniform_negs")
    assert "to evaluate (eval_fraction > 0)" in message
    # training and evaluation both sampling uniformly: one warning, about training
    data = _config(num_uniform_negs=5, eval_fraction=0.1, eval_num_uniform_negs=100)
    assert [path for _, path, _ in _featurized_issues(data)] == ["num_uniform_negs"]


def test_all_negs_on_a_plain_relation_beside_a_featurized_type_is_fine() -> None:
    data = _config(relations=[{"name": "reads", "lhs": "author", "rhs": "doc"},
                              {"name": "follows", "lhs": "author", "rhs": "author", "all_negs": True}])
    assert parse_config(data).relations[1].all_negs


def test_eval_rule_applies_only_when_training_evaluates() -> None:
    # eval_fraction 0 (the original's own featurized sample): eval negatives are never drawn
    data = _config(eval_fraction=0.0, eval_num_uniform_negs=1000)
    assert parse_config(data).eval_num_uniform_negs == 1000
    assert _featurized_issues(data) == []


def test_a_default_featurized_config_loads_with_one_warning() -> None:
    # defaults: 50 uniform negatives in training, 1000 in eval with eval_fraction 0.05: the
    # original trains it (uniform negatives skipped on the featurized side)
    data = _config()
    del data["num_uniform_negs"], data["eval_num_uniform_negs"]
    parse_config(data)
    assert [rule_id for rule_id, _, _ in _featurized_issues(data)] == ["config-featurized-uniform-negs"]


def test_a_plain_config_is_unaffected() -> None:
    data = _config(entities={"author": {"num_partitions": 1}, "doc": {"num_partitions": 1}},
                   num_uniform_negs=50, num_batch_negs=0, eval_fraction=0.1, eval_num_uniform_negs=100,
                   eval_num_batch_negs=10,
                   relations=[{"name": "reads", "lhs": "author", "rhs": "doc", "all_negs": True}])
    cfg = parse_config(data)
    assert cfg.featurized_types() == []
    assert _featurized_issues(data) == []


def test_the_originals_featurized_sample_validates_clean(featurized_sample: Path) -> None:
    config = featurized_sample / "checkpoint" / "config.json"
    raw = json.loads(config.read_text(encoding="utf-8"))
    assert (raw["eval_fraction"], raw["eval_num_uniform_negs"], raw["num_uniform_negs"]) == (0.0, 1000, 0)
    assert parse_config(raw).featurized_types() == ["doc"]
    report = validate_path(featurized_sample)
    assert report.ok and report.issues == [], [str(i) for i in report.issues]


# --------------------------------------------------------------------------- edge-features-unused


def test_unused_feature_datasets_are_a_warning_naming_side_and_types(tmp_path: Path) -> None:
    config = write_layout(tmp_path, LAYOUTS["default"]())
    MUTATORS["edge-features-unused"](tmp_path)
    report = validate_path(config)
    assert report.ok  # a warning: the original's reader ignores the datasets
    [issue] = [i for i in report.issues if i.rule == "edge-features-unused"]
    assert issue.severity == "warning"
    assert issue.file == "edges/edges_0_0.h5"
    assert issue.dataset == "rhsd_offsets"
    assert issue.message.startswith("expected no rhsd_* datasets")
    assert "item, user" in issue.message and "found rhsd_offsets, rhsd_data" in issue.message
    assert report.rule_ids() == {"edge-features-unused"}


def test_feature_datasets_on_a_featurized_side_are_not_reported(tmp_path: Path) -> None:
    # the default layout's bucket (0, 0) holds lhsd_* for the featurized lhs type 'doc'
    config = write_layout(tmp_path, LAYOUTS["default"]())
    assert validate_path(config).issues == []


def test_unused_features_need_the_config(tmp_path: Path) -> None:
    write_layout(tmp_path, LAYOUTS["default"]())
    MUTATORS["edge-features-unused"](tmp_path)
    bucket = tmp_path / "edges" / naming.bucket_file(0, 0)
    report = validate_path(bucket)
    assert "edge-features-unused" not in report.rule_ids(), [str(i) for i in report.issues]
