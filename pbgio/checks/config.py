"""The config's rules: every rule of the ``config`` artifact, over values already read.

Readers (:func:`pbgio.config.parse_config`, :mod:`pbgio.python_config`), the validator and the
trainer build their config issues here and nowhere else:

>>> unreadable("run.json", "expected a JSON object, found list").rule
'config-unreadable'
>>> schema_issue("run.json", "--epochs", "expected an integer, found 'x'").severity
'error'
>>> key_case_issues({"numEpochs": 2})[0].dataset
'numEpochs'
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pbgio.errors import Issue
from pbgio.spec.config import (
    CONFIG_KEYS,
    KEYS_BY_OBJECT,
    REGULARIZERS,
    ConfigSchema,
    key_paths,
)
from pbgio.spec.config_keys import mixed_case_to_snake_case
from pbgio.spec.naming import entity_type_name_portability, entity_type_name_problem
from pbgio.spec.rules import rule


def unreadable(file: str | None, message: str) -> Issue:
    """``config-unreadable``: the config file cannot be read as a JSON object (``message`` says
    what was found: no file, invalid JSON, another JSON value, a Python config that fails)."""
    return rule("config-unreadable").issue(file, None, message)


def schema_issue(file: str | None, dataset: str | None, message: str) -> Issue:
    """``config-schema``: a key or value the schema refuses; ``dataset`` names the key (or the
    command-line option that set it), ``message`` what was expected and found."""
    return rule("config-schema").issue(file, dataset, message)


def featurized_ranking(source: str, featurized: Sequence[str], option: str) -> Issue:
    """``config-featurized-all-negs`` for a command-line ``option`` (``--filter``,
    ``--all-entities``) that ranks against all entities where every side that takes negatives is of
    a featurized type (``featurized``): their entities (bags of features) have no table to rank
    against (docs/guides/featurized.md)."""
    return _featurized_all_negs(
        source, option,
        f"expected a relation with a plain side to rank against all entities, found every side that takes "
        f"negatives featurized (entity types {list(featurized)}: bags of features, with no table to rank "
        f"against); evaluate without {option} (sampled: same-batch candidates)")


def _featurized_all_negs(file: str | None, dataset: str, message: str) -> Issue:
    return rule("config-featurized-all-negs").issue(file, dataset, message)


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def did_you_mean(key: str, known: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known`` to a mistyped ``key``, or ``""``."""
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown_key_message(loc: tuple[int | str, ...]) -> str:
    key = str(loc[-1])
    context = tuple(p for p in loc[:-1] if isinstance(p, str))
    known: tuple[str, ...] = KEYS_BY_OBJECT.get(context[:1], ()) if context else CONFIG_KEYS
    if context[:1] == ("entities",):
        known = KEYS_BY_OBJECT[("entities",)]
    return f"unknown key {key!r}{did_you_mean(key, known)}"


_PYDANTIC_MESSAGES = {
    "missing": "is required",
    "too_short": "must not be empty",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than_equal": "must be at most {le}",
    "literal_error": "expected one of {expected}",
}


def pydantic_issues(errors: Iterable[Mapping[str, Any]]) -> list[Issue]:
    """The ``config-schema`` issues of pydantic's validation errors of :class:`ConfigSchema`."""
    return [_issue_from_pydantic(error) for error in errors]


def _issue_from_pydantic(error: Mapping[str, Any]) -> Issue:
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        message = _unknown_key_message(loc)
    elif kind in _PYDANTIC_MESSAGES:
        message = _PYDANTIC_MESSAGES[kind].format(**error.get("ctx", {}))
        if kind == "literal_error":
            message += f", found {error['input']!r}"
        elif kind != "missing":
            message += f", found {error['input']!r}" if not isinstance(error["input"], list | dict) else ""
    else:
        message = f"{error['msg'][0].lower()}{error['msg'][1:]}, found {error['input']!r}"
    return schema_issue(None, _format_loc(loc), message)


def semantic_issues(cfg: ConfigSchema) -> list[Issue]:
    """Rules across keys: errors for what the original cannot run (it refuses the config or fails
    while training), warnings for what it runs differently than a user may think."""
    issues: list[Issue] = []

    def add(rule_id: str, path: str, message: str) -> None:
        issues.append(rule(rule_id).issue(None, path, message))

    for name, entity in cfg.entities.items():
        problem = entity_type_name_problem(name, entity.num_partitions)
        if problem:
            add("entity-type-name-unsafe", f"entities.{name}",
                f"expected a name the original can use in file and parameter names, found {name!r}, which {problem}")
        elif entity_type_name_portability(name):
            add("entity-type-name-unportable", f"entities.{name}",
                f"expected a name portable across file systems, found {name!r}, which "
                f"{entity_type_name_portability(name)}")
    for i, rel in enumerate(cfg.relations):
        for side in ("lhs", "rhs"):
            etype = getattr(rel, side)
            if etype not in cfg.entities:
                add("config-relation-entity-unknown", f"relations[{i}].{side}",
                    f"expected one of the entity types {sorted(cfg.entities)}, found {etype!r}")
    if cfg.dynamic_relations and len(cfg.relations) != 1:
        add("config-dynamic-relations-count", "relations",
            f"expected exactly 1 relation with dynamic_relations, found {len(cfg.relations)}")
    if cfg.dynamic_relations and cfg.global_emb:
        add("config-global-emb-dynamic", "global_emb",
            "expected false with dynamic_relations (the original cannot train global embeddings "
            "with dynamic relations), found true")
    if cfg.disable_lhs_negs and cfg.disable_rhs_negs:
        add("config-negatives-disabled", "disable_rhs_negs",
            "expected at most one side with negatives disabled, found both")
    for side in ("lhs", "rhs"):
        parts = {
            getattr(r, side): cfg.entities[getattr(r, side)].num_partitions
            for r in cfg.relations
            if getattr(r, side) in cfg.entities and cfg.entities[getattr(r, side)].num_partitions > 1
        }
        if len(set(parts.values())) > 1:
            add("config-partitions-inconsistent", "entities",
                f"expected one num_partitions for all partitioned {side} types, found {parts}")
    for i, rel in enumerate(cfg.relations):
        if not {rel.lhs, rel.rhs} <= set(cfg.entities):
            continue
        lhs_dim, rhs_dim = cfg.entity_dimension(rel.lhs), cfg.entity_dimension(rel.rhs)
        if lhs_dim != rhs_dim:
            add("config-relation-dimensions", f"relations[{i}]",
                f"expected one dimension for lhs {rel.lhs!r} and rhs {rel.rhs!r} of relation {rel.name!r}, "
                f"found {lhs_dim} and {rhs_dim}")
        elif rel.operator == "complex_diagonal" and lhs_dim % 2:
            add("config-complex-odd-dimension", f"relations[{i}].operator",
                f"expected an even dimension for complex_diagonal, found {lhs_dim} for {rel.lhs!r}")
    if cfg.num_batch_negs > 0 and cfg.batch_size % cfg.num_batch_negs:
        add("config-batch-negs-divide", "batch_size",
            f"expected a multiple of num_batch_negs={cfg.num_batch_negs}, found {cfg.batch_size}")
    sampled = [r.name for r in cfg.relations if not r.all_negs]
    if cfg.num_batch_negs == 0 and cfg.num_uniform_negs == 0 and sampled:
        add("config-no-negatives", "num_uniform_negs",
            f"expected num_batch_negs or num_uniform_negs > 0 for relation {sampled[0]!r} (all_negs false), "
            "found both 0")
    if not cfg.eval_num_batch_negs:
        add("config-eval-batch-negs", "eval_num_batch_negs",
            f"expected an integer > 0 (the original rounds its evaluation batch size to a multiple of it "
            f"before every bucket, held-out edges or not), found {cfg.eval_num_batch_negs}")
    if cfg.num_machines > 1 and all(e.num_partitions == 1 for e in cfg.entities.values()):
        add("config-machines-partitions", "num_machines",
            f"expected a partitioned entity type for num_machines={cfg.num_machines}, found none")
    if cfg.checkpoint_preservation_interval == 0:
        issues.append(schema_issue(
            None, "checkpoint_preservation_interval",
            "expected null or a non-zero integer (the original takes epoch % interval), found 0"))
    if cfg.regularization_coef != 0 and cfg.regularizer not in REGULARIZERS:
        issues.append(schema_issue(
            None, "regularizer", f"expected one of {list(REGULARIZERS)} with regularization_coef="
            f"{cfg.regularization_coef}, found {cfg.regularizer!r}"))
    _unusual_values(cfg, add)
    issues += _featurized_negative_issues(cfg, cfg.num_batch_negs, cfg.num_uniform_negs,
                                          ("num_batch_negs", "num_uniform_negs"), "to train")
    if cfg.eval_fraction > 0:
        seen = {i.rule for i in issues}  # one issue per rule when training and evaluation agree
        eval_uniform = cfg.num_uniform_negs if cfg.eval_num_uniform_negs is None else cfg.eval_num_uniform_negs
        issues += [i for i in _featurized_negative_issues(
            cfg, cfg.eval_num_batch_negs or 0, eval_uniform,
            ("eval_num_batch_negs", "eval_num_uniform_negs"), "to evaluate (eval_fraction > 0)")
            if i.rule not in seen]
    if cfg.loss_fn == "logistic" and cfg.comparator == "cos":
        add("config-logistic-cos", "loss_fn",
            "expected a comparator other than cos with the logistic loss, found cos")
    return issues


def _unusual_values(cfg: ConfigSchema, add: Callable[[str, str, str], None]) -> None:
    if cfg.regularization_coef < 0:
        add("config-unusual-value", "regularization_coef",
            f"expected a regularization_coef >= 0, found {cfg.regularization_coef}: a negative one rewards "
            "large embeddings (the original and pbgtrain apply it as given)")
    if cfg.regularization_coef == 0 and cfg.regularizer not in REGULARIZERS:
        add("config-unusual-value", "regularizer",
            f"expected one of {list(REGULARIZERS)}, found {cfg.regularizer!r} (unused while regularization_coef is 0)")
    interval = cfg.checkpoint_preservation_interval
    if interval is not None and interval < 0:
        add("config-unusual-value", "checkpoint_preservation_interval",
            f"expected a positive interval, found {interval}: the original keeps a snapshot every {-interval} "
            "epoch(s) (epoch % interval), and so does pbgtrain")
    if cfg.num_partition_servers < -1:
        add("config-unusual-value", "num_partition_servers",
            f"expected -1, 0 or a positive count, found {cfg.num_partition_servers} (taken as -1)")


def _featurized_negative_issues(cfg: ConfigSchema, batch_negs: int, uniform_negs: int, keys: tuple[str, str],
                                when: str) -> list[Issue]:
    """Negatives of featurized sides (docs/guides/featurized.md) with ``batch_negs`` same-batch and ``uniform_negs``
    uniform negatives (``keys`` name the two settings, ``when`` says when they apply): a
    featurized side has no table to sample or list, so it takes same-batch negatives only. The
    original fails on ``all_negs`` or on 0 batch negatives there, and skips its uniform ones."""
    featurized = set(cfg.featurized_types())
    disabled = {"lhs": cfg.disable_lhs_negs, "rhs": cfg.disable_rhs_negs}
    issues: list[Issue] = []
    warned = False
    for i, rel in enumerate(cfg.relations):
        for side in ("lhs", "rhs"):
            etype = getattr(rel, side)
            if etype not in featurized or disabled[side]:
                continue
            what = f"the {side} type {etype!r} of relation {rel.name!r} is featurized"
            if rel.all_negs:
                issues.append(_featurized_all_negs(
                    None, f"relations[{i}].all_negs",
                    f"expected false because {what} (a featurized type has no list of entities to rank "
                    "against), found true"))
                break
            if batch_negs <= 0:
                issues.append(rule("config-featurized-batch-negs").issue(
                    None, keys[0], f"expected > 0 {when} because {what} (it takes same-batch negatives only), "
                    f"found {batch_negs}"))
                return issues
            if uniform_negs > 0 and not warned:
                warned = True
                issues.append(rule("config-featurized-uniform-negs").issue(
                    None, keys[1], f"{keys[1]}={uniform_negs} {when}, but {what}: it takes same-batch negatives "
                    "only (its uniform negatives are skipped, as in the original); plain sides take their "
                    f"{uniform_negs} uniform negatives"))
    return issues


def key_case_issues(data: Any) -> list[Issue]:
    """Warnings (rule ``config-key-mixedcase``) for the mixedCase keys of a raw config."""
    if not isinstance(data, dict):
        return []
    return [rule("config-key-mixedcase").issue(
        None, f"{path}{key}", f"expected snake_case keys, found {key!r}: read as {mixed_case_to_snake_case(key)!r}, "
        "as the original reads it")
        for path, node in key_paths(data) for key in node
        if isinstance(key, str) and mixed_case_to_snake_case(key) != key]

