"""Trainer config: overrides, and no key is silently ignored (each acts as documented or is refused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pbgio.config import CONFIG_KEYS, ConfigSchema, parse_config
from pbgio.errors import ConfigError
from pbgio.layout import override_config_dict
from pbgtrain.config import _PARTITION_SERVER_TUNING, KEY_EFFECTS, load_run_config

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "training.md"
RAW = {"entities": {"e": {"num_partitions": 1}}, "relations": [{"name": "r", "lhs": "e", "rhs": "e"}],
       "dimension": 8, "entity_path": "d", "edge_paths": ["d/e"], "checkpoint_path": "m"}


def test_every_key_is_documented_in_code_and_guide() -> None:
    assert set(KEY_EFFECTS) == set(CONFIG_KEYS)
    guide = GUIDE.read_text(encoding="utf-8")
    missing = [key for key in CONFIG_KEYS if f"`{key}`" not in guide]
    assert not missing, f"keys missing from {GUIDE.name}: {missing}"


@pytest.mark.parametrize(("key", "value"), [
    *[(k, v) for k, v in {"num_partition_servers": 2, "num_groups_for_partition_server": 4,
                          "num_groups_per_sharded_partition_server": 2, "partition_shard_size": 10}.items()],
    ("num_gpus", 2),
])
def test_unsupported_settings_are_refused_with_the_key(tmp_path: Path, key: str, value: object) -> None:
    assert key in _PARTITION_SERVER_TUNING or key in ("num_gpus", "num_partition_servers")
    raw = dict(RAW, **{key: value})
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=key):
        load_run_config(path)


@pytest.mark.parametrize(("key", "value"), [
    ("num_machines", 2), ("num_partition_servers", 0), ("num_partition_servers", -1),
    ("distributed_init_method", "tcp://x:1"), ("distributed_tree_init_order", False)])
def test_distributed_settings_are_accepted(tmp_path: Path, key: str, value: object) -> None:
    raw = dict(RAW, entities={"e": {"num_partitions": 2}}, **{key: value})
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw))
    assert getattr(load_run_config(path).config, key) == value


def test_hogwild_delay_is_accepted_as_the_original_accepts_it(tmp_path: Path) -> None:
    # The original ignores it on one machine; its own featurized sample sets 0.0.
    path = tmp_path / "c.json"
    path.write_text(json.dumps(dict(RAW, hogwild_delay=0.0)))
    assert load_run_config(path).config.hogwild_delay == 0.0


@pytest.mark.parametrize(("changes", "key"), [
    ({"num_uniform_negs": 10, "num_batch_negs": 0}, "num_batch_negs"),
    ({"num_uniform_negs": 0, "relations": [{"name": "r", "lhs": "e", "rhs": "e", "all_negs": True}]}, "all_negs"),
])
def test_featurized_negative_rules_are_enforced_at_load(tmp_path: Path, changes: dict[str, object],
                                                        key: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(dict(RAW, entities={"e": {"num_partitions": 1, "featurized": True}}, **changes)))
    with pytest.raises(ConfigError, match=key) as info:
        load_run_config(path)
    assert "featurized" in str(info.value)


@pytest.mark.parametrize("uniform", [0, 50])
def test_featurized_types_load_with_same_batch_negatives(tmp_path: Path, uniform: int) -> None:
    # with uniform negatives too, as the original trains them (skipped on the featurized side)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(dict(RAW, entities={"e": {"num_partitions": 2, "featurized": True}},
                                    num_uniform_negs=uniform, eval_num_uniform_negs=uniform)))
    assert load_run_config(path).config.entities["e"].featurized
def test_overrides_reach_nested_keys_lists_and_null() -> None:
    cfg = parse_config(override_config_dict(RAW, ["entities.e.num_partitions=3", "relations.0.all_negs=true",
                                                  "max_norm=null", "edge_paths=a,b", "lr=0.5"]))
    assert isinstance(cfg, ConfigSchema)
    assert (cfg.entities["e"].num_partitions, cfg.relations[0].all_negs, cfg.max_norm, cfg.edge_paths, cfg.lr) == \
        (3, True, None, ["a", "b"], 0.5)


@pytest.mark.parametrize(("override", "fragment"), [
    ("lr", "expected key=value"), ("relations.5.operator=none", "index below 1"), ("nope=1", "nope"),
    ("num_epochs=-1", "num_epochs"),
])
def test_bad_overrides_name_the_problem(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_config(override_config_dict(RAW, [override]))
