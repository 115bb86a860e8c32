"""Config acceptance, differential: pbgio's ``parse_config`` against what the original runs.

The documented relationship: **what the original can run, pbgio accepts** (possibly with
warnings); **what the original refuses or crashes on, pbgio refuses**. Each case below is fed
to both:

* the original (``original_driver.py configs``): ``ConfigSchema.from_dict``, then, on a tiny
  layout written with its own storage classes, ``make_model`` and one epoch of
  ``torchbiggraph.train.train`` (HOGWILD pool replaced by an in-process one). Its verdict is
  ``RUNS``, ``REFUSES`` (``from_dict`` raises) or ``CRASHES`` (anything later raises);
* ``pbgio.config.parse_config``: accepts (warnings allowed) or raises ``ConfigError``.

The ``original`` column records the verdict observed with the original (commit 6fccd3f) and
where it comes from; the test checks the table against the original too, so it stays true.

Each case is the base config (two unpartitioned types ``user`` → ``item``, ``translation``,
dimension 8, batch 20, 10 batch + 5 uniform negatives) with the keys shown changed; ``-k`` a
key removed. ``F`` is ``user`` made featurized.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from interop_harness import Original

from pbgio.config import parse_config, semantic_issues
from pbgio.errors import ConfigError

pytestmark = pytest.mark.interop

RUNS, REFUSES, CRASHES = "runs", "refuses", "crashes"

BASE: dict[str, Any] = {
    "entities": {"user": {"num_partitions": 1}, "item": {"num_partitions": 1}},
    "relations": [{"name": "likes", "lhs": "user", "rhs": "item", "operator": "translation"}],
    "dimension": 8, "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model",
    "num_epochs": 1, "batch_size": 20, "num_batch_negs": 10, "num_uniform_negs": 5, "workers": 1,
    "eval_num_batch_negs": 10, "eval_num_uniform_negs": 5,
}
F = {"user": {"num_partitions": 1, "featurized": True}, "item": {"num_partitions": 1}}


def rel(**kw: Any) -> list[dict[str, Any]]:
    return [{"name": "likes", "lhs": "user", "rhs": "item", **kw}]


def named(name: str, **config: Any) -> dict[str, Any]:
    """Entity type ``user`` renamed to ``name``."""
    return {"entities": {name: {"num_partitions": 1}, "item": {"num_partitions": 1}},
            "relations": [{"name": "likes", "lhs": name, "rhs": "item"}], **config}


@dataclass(frozen=True)
class Case:
    id: str
    change: dict[str, Any]
    original: str  # RUNS, REFUSES or CRASHES, as observed
    why: str  # where the original's verdict comes from
    remove: tuple[str, ...] = field(default=())

    def config(self) -> dict[str, Any]:
        config = copy.deepcopy(BASE)
        for key in self.remove:
            config.pop(key)
        config.update(copy.deepcopy(self.change))
        return config


# id                          change                                     original  why (the original's code)
CASES = [
    # --- valid configs
    Case("valid-base", {}, RUNS, "-"),
    Case("valid-dynamic", {"dynamic_relations": True, "global_emb": False}, RUNS, "-"),
    Case("valid-featurized", {"entities": F, "num_uniform_negs": 0, "eval_num_uniform_negs": 0}, RUNS, "-"),
    Case("valid-featurized-2-parts", {"entities": {"user": {"num_partitions": 2, "featurized": True},
                                                   "item": {"num_partitions": 2}},
                                      "num_uniform_negs": 0, "eval_num_uniform_negs": 0}, RUNS,
         "featurized types may be partitioned"),
    Case("valid-all-negs", {"relations": rel(all_negs=True)}, RUNS, "warns: uniform negatives make no sense"),
    Case("valid-uniform-only", {"num_batch_negs": 0}, RUNS, "model.py: Negatives.UNIFORM"),
    Case("valid-eval-fraction-1", {"eval_fraction": 1.0}, RUNS, "every edge held out, none trained"),
    Case("valid-epochs-0", {"num_epochs": 0}, RUNS, "-"),
    Case("valid-lr-0", {"lr": 0}, RUNS, "-"),
    Case("valid-max-norm", {"max_norm": 1.0}, RUNS, "-"),
    Case("valid-margin-negative", {"margin": -1.0}, RUNS, "margin has no validator"),
    Case("valid-background-io", {"background_io": True}, RUNS, "config.py: warns, deprecated"),
    Case("valid-logistic-cos", {"loss_fn": "logistic", "comparator": "cos"}, RUNS, "config.py: warns"),
    Case("valid-half-precision", {"half_precision": True}, RUNS, "only used on CUDA"),
    Case("valid-distributed-init", {"distributed_init_method": "tcp://localhost:1"}, RUNS, "unused on 1 machine"),
    Case("valid-bias-dim-1", {"bias": True, "dimension": 1}, RUNS, "-"),
    Case("valid-relation-name", {"relations": [{"name": "likes: a.b/c d", "lhs": "user", "rhs": "item"}]}, RUNS,
         "relation names are not used in file names"),
    # --- mixedCase keys (schema.py:47 converts them, then looks them up)
    Case("mixedcase-numEpochs", {"numEpochs": 1}, RUNS, "schema.py:199 mixed_case_to_lowercase",
         remove=("num_epochs",)),
    Case("mixedcase-clash", {"numEpochs": 2, "num_epochs": 1}, RUNS, "schema.py:199 the later key wins",
         remove=("num_epochs",)),
    Case("mixedcase-nested", {"entities": {"user": {"numPartitions": 1}, "item": {"num_partitions": 1}},
                              "relations": rel(allNegs=False)}, RUNS, "schema.py:199, in every schema"),
    # --- lenient bools (schema.py Loader.map_bool: True/False, 0/1, 1/y/yes/true/on, 0/n/no/false/off)
    Case("bool-yes", {"global_emb": "yes"}, RUNS, "schema.py:173 TRUE_STRINGS"),
    Case("bool-ON", {"bias": "ON"}, RUNS, "schema.py:173 lower()"),
    Case("bool-1", {"bias": 1}, RUNS, "schema.py:170 int 0/1"),
    Case("bool-t", {"bias": "t"}, REFUSES, "schema.py:177 'Not a bool' ('t' is not in TRUE_STRINGS)"),
    Case("bool-2", {"bias": 2}, REFUSES, "schema.py:177 'Not a bool'"),
    Case("bool-float", {"bias": 1.0}, REFUSES, "schema.py:177 'Not a bool' (a float is not an int)"),
    # --- enum case: only bucket_order is an Enum; operator/comparator/loss/regularizer are plain str
    Case("enum-AFFINITY", {"bucket_order": "AFFINITY"}, RUNS, "schema.py:188 Enum by upper()"),
    Case("enum-COS", {"comparator": "COS"}, CRASHES, "model.py:899 COMPARATORS.get_class -> plugin.py:40"),
    Case("enum-Diagonal", {"relations": rel(operator="Diagonal")}, CRASHES,
         "model.py:889 instantiate_operator -> plugin.py:40"),
    Case("enum-SOFTMAX", {"loss_fn": "SOFTMAX"}, CRASHES, "train_cpu.py:465 LOSS_FUNCTIONS.get_class"),
    Case("enum-n3", {"regularizer": "n3", "regularization_coef": 1e-3}, CRASHES, "model.py:906 REGULARIZERS"),
    # --- numbers
    Case("int-for-float", {"lr": 1, "margin": 1, "init_scale": 1}, RUNS, "schema.py:86 ints are floats"),
    Case("bool-for-int", {"num_epochs": True}, RUNS, "schema.py:79 a bool is an int"),
    Case("float-for-int", {"num_epochs": 1.0}, REFUSES, "schema.py:80 'Not an int'"),
    Case("str-for-int", {"batch_size": "20"}, REFUSES, "schema.py:80 'Not an int'"),
    Case("str-for-dimension", {"dimension": "8"}, REFUSES, "schema.py:80 'Not an int'"),
    Case("str-for-float", {"lr": "0.1"}, REFUSES, "schema.py:87 'Not a float'"),
    # --- unknown keys
    Case("unknown-key", {"learning_rate": 0.1}, REFUSES, "schema.py:203 'Unknown key'"),
    Case("unknown-nested-key", {"relations": rel(operatr="none")}, REFUSES, "schema.py:203 'Unknown key'"),
    Case("entities-not-dict", {"entities": []}, REFUSES, "schema.py:115 'Not a dict'"),
    # --- featurized
    Case("featurized-uniform-negs", {"entities": F, "eval_num_uniform_negs": 0}, RUNS,
         "model.py:553 uniform negatives skipped for featurized types (NotImplementedError caught)"),
    Case("featurized-eval-uniform-negs", {"entities": F, "num_uniform_negs": 0}, RUNS,
         "model.py:553, the same during evaluation"),
    Case("featurized-all-negs", {"entities": F, "num_uniform_negs": 0, "eval_num_uniform_negs": 0,
                                 "relations": rel(all_negs=True)}, CRASHES,
         "entitylist.py:75 via model.py:583 (all_negs on a featurized side)"),
    Case("featurized-uniform-only", {"entities": F, "num_batch_negs": 0, "eval_num_uniform_negs": 0}, CRASHES,
         "model.py:544 Negatives.UNIFORM -> sample_entities raises NotImplementedError"),
    Case("featurized-side-disabled-all-negs", {"entities": F, "disable_lhs_negs": True,
                                               "relations": rel(all_negs=True)}, RUNS,
         "model.py:662 the featurized lhs takes no negatives; the plain rhs all of them"),
    Case("featurized-side-disabled-uniform-only", {"entities": F, "disable_lhs_negs": True, "num_batch_negs": 0},
         RUNS, "model.py:662 the featurized lhs takes no negatives; the plain rhs uniform ones"),
    Case("featurized-no-negatives", {"entities": F, "num_uniform_negs": 0, "num_batch_negs": 0,
                                     "eval_num_uniform_negs": 0}, CRASHES,
         "model.py:652 chunk size 0, then ceil_of_ratio at model.py:348"),
    # --- negatives and batches
    Case("batch-not-multiple", {"batch_size": 25}, CRASHES, "model.py:880"),
    Case("no-negatives", {"num_batch_negs": 0, "num_uniform_negs": 0}, CRASHES,
         "model.py:652 chunk size 0, then ceil_of_ratio at model.py:348"),
    Case("eval-batch-negs-0", {"eval_num_batch_negs": 0, "eval_fraction": 0.1}, CRASHES,
         "train_cpu.py:887 -> util.py:244 round_up_to_nearest_multiple(batch_size, 0)"),
    Case("eval-batch-negs-null", {"eval_num_batch_negs": None, "eval_fraction": 0.1}, CRASHES,
         "train_cpu.py:887 -> util.py:244 round_up_to_nearest_multiple(batch_size, None)"),
    Case("eval-batch-negs-null-no-eval", {"eval_num_batch_negs": None, "eval_fraction": 0.0}, CRASHES,
         "train_cpu.py:887 rounds the eval batch size even without held-out edges"),
    Case("eval-batch-negs-0-no-eval", {"eval_num_batch_negs": 0, "eval_fraction": 0.0}, CRASHES,
         "train_cpu.py:887 -> util.py:244 (even without held-out edges)"),
    Case("negatives-both-disabled", {"disable_lhs_negs": True, "disable_rhs_negs": True}, REFUSES, "config.py:529"),
    # --- relations and dimensions
    Case("global-emb-dynamic", {"dynamic_relations": True}, CRASHES, "model.py:489"),
    Case("dynamic-two-relations", {"dynamic_relations": True, "global_emb": False,
                                   "relations": [*rel(), {"name": "b", "lhs": "user", "rhs": "item"}]},
         REFUSES, "config.py:519"),
    Case("complex-odd-dimension", {"dimension": 7, "relations": rel(operator="complex_diagonal")}, CRASHES,
         "operators.py:133"),
    Case("dimension-mismatch", {"entities": {"user": {"num_partitions": 1, "dimension": 4},
                                             "item": {"num_partitions": 1}}}, CRASHES,
         "util.py:113 match_shape in the comparator (lhs 4 vs rhs 8)"),
    Case("unknown-entity", {"relations": rel(rhs="nobody")}, REFUSES, "config.py:512"),
    Case("operator-unknown", {"relations": rel(operator="rotate")}, CRASHES, "plugin.py:40"),
    Case("comparator-unknown", {"comparator": "manhattan"}, CRASHES, "plugin.py:40"),
    Case("regularizer-unknown", {"regularizer": "L2", "regularization_coef": 0.1}, CRASHES, "plugin.py:40"),
    Case("regularizer-unknown-unused", {"regularizer": "L2"}, RUNS,
         "model.py:905 looked up only when regularization_coef != 0"),
    Case("regularization-negative", {"regularization_coef": -0.1}, RUNS, "no validator"),
    Case("relation-weight-0", {"relations": rel(weight=0)}, REFUSES, "schema.py:215 positive"),
    # --- partitions, machines
    Case("partitions-inconsistent", {"entities": {"user": {"num_partitions": 2}, "item": {"num_partitions": 3},
                                                  "tag": {"num_partitions": 3}},
                                     "relations": [{"name": "a", "lhs": "user", "rhs": "item"},
                                                   {"name": "b", "lhs": "tag", "rhs": "item"}]}, CRASHES,
         "util.py:378"),
    Case("machines-2-unpartitioned", {"num_machines": 2}, CRASHES, "util.py:404"),
    Case("partition-servers--2", {"num_partition_servers": -2}, RUNS,
         "train_cpu.py:308 only > 0 means anything on one machine"),
    # --- entity type names (file names, ParameterDict/ModuleDict keys)
    Case("name-space", named("my user"), RUNS, "-"),
    Case("name-colon", named("user:v1"), RUNS, "a legal file name on Linux"),
    Case("name-question-mark", named("user?"), RUNS, "a legal file name on Linux"),
    Case("name-trailing-space", named("user "), RUNS, "a legal file name on Linux"),
    Case("name-control-char", named("us\x01er"), RUNS, "a legal file name on Linux"),
    Case("name-backslash", named("a\\b"), RUNS, "a legal file name on Linux"),
    Case("name-210-bytes", named("u" * 210), RUNS, "embeddings_<210 bytes>_0.v1.h5 fits in 255 bytes"),
    Case("name-250-bytes", named("u" * 250), CRASHES, "graph_storages.py: entity_count_<250 bytes>_0.txt is too long"),
    Case("name-nul", named("us\x00er"), CRASHES, "open(): embedded null byte"),
    Case("name-dot", named("user.v1"), CRASHES, "model.py:436 ParameterDict key can't contain '.'"),
    Case("name-dot-no-global", named("user.v1", global_emb=False), CRASHES,
         "model.py:452 ModuleDict key can't contain '.'"),
    Case("name-slash", named("a/b"), CRASHES, "graph_storages.py:156 entity_count_a/b_0.txt"),
    # --- ranges
    Case("eval-fraction-1.5", {"eval_fraction": 1.5}, CRASHES, "train_cpu.py:857 negative train size"),
    Case("hogwild-delay-negative", {"hogwild_delay": -1}, REFUSES, "schema.py:215 non_negative"),
    Case("workers-0", {"workers": 0}, REFUSES, "schema.py:215 positive"),
    Case("preservation-interval-0", {"checkpoint_preservation_interval": 0}, CRASHES, "train_cpu.py:186 % 0"),
    Case("preservation-interval--1", {"checkpoint_preservation_interval": -1}, RUNS,
         "no validator; epoch % -1 == 0"),
    Case("edge-paths-empty", {"edge_paths": []}, CRASHES, "train_cpu.py:131 // 0 edge paths"),
]
CASES_BY_ID = {c.id: c for c in CASES}
assert len(CASES_BY_ID) == len(CASES), "case ids are unique"


@pytest.fixture(scope="module")
def original_verdicts(original: Original, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("config_acceptance")
    cases = root / "cases.json"
    cases.write_text(json.dumps([{"id": c.id, "config": c.config()} for c in CASES]))
    verdicts: dict[str, Any] = original.driver(
        "configs", ["--cases", str(cases), "--workdir", str(root / "work")], workdir=root)
    return verdicts


def original_verdict(entry: dict[str, Any]) -> tuple[str, str]:
    if entry["runs"]:
        return RUNS, "; ".join(entry.get("warnings", [])) or "no warning"
    failure = entry.get("failure") or entry["from_dict"]
    verdict = REFUSES if entry["stage"] == "ConfigSchema.from_dict" else CRASHES
    return verdict, f"{entry['stage']}: {failure['error']} at {failure['where']}"


def pbgio_verdict(config: dict[str, Any]) -> tuple[bool, str]:
    try:
        cfg = parse_config(config)
    except ConfigError as exc:
        return False, "; ".join(f"[{i.rule}] {i.dataset}: {i.message}" for i in exc.issues)
    warnings = semantic_issues(cfg)
    return True, "; ".join(f"[{i.rule}] {i.message}" for i in warnings) or "no warning"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_pbgio_accepts_exactly_what_the_original_runs(case: Case, original_verdicts: dict[str, Any]) -> None:
    observed, detail = original_verdict(original_verdicts[case.id])
    assert observed == case.original, (
        f"the table is out of date: the original {observed} ({detail}); the table says {case.original}")
    accepted, ours = pbgio_verdict(case.config())
    if case.original == RUNS:
        assert accepted, f"the original runs this config ({case.why}); pbgio refuses it: {ours}"
    else:
        verb = "refuses this config" if case.original == REFUSES else "crashes on this config"
        assert not accepted, f"the original {verb} ({detail}); pbgio accepts it ({ours})"
