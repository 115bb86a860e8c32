"""The run config: every key, default and rule of the original PBG config.

One pydantic declaration (:class:`ConfigSchema`) gives the loader, the dumper
(``config.json`` exactly as the original writes it) and the published JSON
Schema ``schemas/config.schema.json``. Values are read as the original reads them (mixedCase
keys such as ``numEpochs`` as ``num_epochs``; an int for a float; ``"yes"``/``1`` for a bool;
not ``"3"`` for an int). Loading reports every problem at once, each with its path:

>>> cfg = parse_config({
...     "entities": {"user": {"num_partitions": 2}},
...     "relations": [{"name": "follows", "lhs": "user", "rhs": "user"}],
...     "dimension": 16, "entity_path": "data", "edge_paths": ["data/train"],
...     "checkpoint_path": "model"})
>>> cfg.comparator, cfg.entity_dimension("user"), cfg.num_partitions("user")
('cos', 16, 2)
>>> try:
...     parse_config({"entities": {}, "relations": [{"name": "r", "lhs": "a", "rhs": "b",
...                    "operatr": "none"}], "dimension": 0, "numEpochs": "3"})
... except ConfigError as e:
...     for issue in e.issues:
...         print(issue.dataset, "|", issue.message)
entities | must not be empty
relations[0].operatr | unknown key 'operatr' (did you mean 'operator'?)
dimension | must be greater than 0, found 0
entity_path | is required
edge_paths | is required
checkpoint_path | is required
num_epochs | expected an integer, found '3'
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from pbgio import storage
from pbgio.errors import ConfigError, Issue, MissingArtifactError
from pbgio.spec.checkpoint import CONFIG_JSON_INDENT
from pbgio.spec.config_keys import mixed_case_to_snake_case as _mixed_case_to_snake_case
from pbgio.spec.naming import entity_type_name_portability, entity_type_name_problem
from pbgio.spec.rules import rule
from pbgio.storage import AnyPath

Operator = Literal["none", "diagonal", "translation", "linear", "affine", "complex_diagonal"]
Comparator = Literal["dot", "cos", "l2", "squared_l2"]
LossFn = Literal["ranking", "logistic", "softmax"]
BucketOrder = Literal["random", "affinity", "inside_out", "outside_in"]
REGULARIZERS = ("N3",)

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
TRUE_STRINGS = frozenset({"1", "y", "yes", "true", "on"})
FALSE_STRINGS = frozenset({"0", "n", "no", "false", "off"})


# The original's loader takes values as they are, except where noted: an int is an int (a bool
# too, being one in Python), a float is an int or a float, a bool is also 0/1 or one of the
# strings above (any case). pydantic's lax mode would also take "20" or 1.0 for an int, which
# the original refuses, so each kind gets its own check before pydantic's (None passes through
# to the optional fields). Integers are int64 and numbers finite float64 (what HDF5, numpy and
# torch hold): JSON's NaN and Infinity, which Python reads, are refused.
def _as_int(value: Any) -> Any:
    if value is None or isinstance(value, int):
        if value is not None and not INT64_MIN <= value <= INT64_MAX:
            raise PydanticCustomError("int64_range", "expected an integer within int64 (at most 2**63 - 1)")
        return int(value) if isinstance(value, bool) else value
    raise PydanticCustomError("not_int", "expected an integer")


def _as_float(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN and Infinity, as Python reads them
        raise PydanticCustomError("not_finite", "expected a finite number")
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            raise PydanticCustomError("not_finite", "expected a number within float64") from None
    if value is None or isinstance(value, int | float):
        return float(value) if isinstance(value, bool) else value
    raise PydanticCustomError("not_float", "expected a number")


def _as_bool(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in TRUE_STRINGS | FALSE_STRINGS:
        return value.lower() in TRUE_STRINGS
    raise PydanticCustomError("not_bool", "expected a bool (true/false, 0/1, or one of the strings "
                                          "yes/no, y/n, on/off, true/false, 1/0)")


Int = Annotated[int, BeforeValidator(_as_int)]
Float = Annotated[float, BeforeValidator(_as_float)]
Bool = Annotated[bool, BeforeValidator(_as_bool)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
PositiveInt = Annotated[int, Field(gt=0), BeforeValidator(_as_int)]
NonNegativeInt = Annotated[int, Field(ge=0), BeforeValidator(_as_int)]
PositiveFloat = Annotated[float, Field(gt=0), BeforeValidator(_as_float)]
NonNegativeFloat = Annotated[float, Field(ge=0), BeforeValidator(_as_float)]
OptionalPositiveInt = Annotated[Annotated[int, Field(gt=0)] | None, BeforeValidator(_as_int)]
OptionalNonNegativeInt = Annotated[Annotated[int, Field(ge=0)] | None, BeforeValidator(_as_int)]
OptionalPositiveFloat = Annotated[Annotated[float, Field(gt=0)] | None, BeforeValidator(_as_float)]
OptionalNonNegativeFloat = Annotated[Annotated[float, Field(ge=0)] | None, BeforeValidator(_as_float)]
OptionalInt = Annotated[int | None, BeforeValidator(_as_int)]


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class EntitySchema(_Strict):
    """One entity type."""

    num_partitions: PositiveInt = Field(
        description="Number of partitions of this type; 1 means unpartitioned.")
    featurized: Bool = Field(
        False, description="Entities are bags of features; counts count features (seed 002).")
    dimension: OptionalPositiveInt = Field(
        None, description="Embedding dimension of this type; null means the global `dimension`.")


class RelationSchema(_Strict):
    """One relation type."""

    name: NonEmptyStr = Field(description="Relation name.")
    lhs: NonEmptyStr = Field(description="Entity type of the left-hand side.")
    rhs: NonEmptyStr = Field(description="Entity type of the right-hand side.")
    weight: PositiveFloat = Field(1.0, description="Multiplier of this relation's loss.")
    operator: Operator = Field("none", description="Operator applied to the rhs (both sides in dynamic mode).")
    all_negs: Bool = Field(False, description="Use every entity of the partition as negatives.")


class ConfigSchema(_Strict):
    """A PBG run config (the keys and defaults of the original, in its order)."""

    # model
    entities: dict[str, EntitySchema] = Field(
        min_length=1, description="Entity types by name.")
    relations: list[RelationSchema] = Field(min_length=1, description="Relation types, by index.")
    dimension: PositiveInt = Field(description="Embedding dimension.")
    init_scale: PositiveFloat = Field(1e-3, description="Std-dev of the normal initial embeddings.")
    max_norm: OptionalPositiveFloat = Field(None, description="Clip embedding norms to this value.")
    global_emb: Bool = Field(True, description="Add a learned per-type vector to every embedding.")
    comparator: Comparator = Field("cos", description="Similarity of lhs and transformed rhs.")
    bias: Bool = Field(False, description="Use embedding coordinate 0 as an additive bias.")
    loss_fn: LossFn = Field("ranking", description="Loss function.")
    margin: Float = Field(0.1, description="Margin of the ranking loss.")
    regularization_coef: Float = Field(0.0, description="Regularizer weight; 0 disables.")
    regularizer: str = Field("N3", description="Regularizer: N3, the only one (used when regularization_coef != 0).")
    # data
    entity_path: NonEmptyStr = Field(description="Directory of entity counts and names.")
    edge_paths: list[NonEmptyStr] = Field(min_length=1, description="Directories of edge buckets.")
    checkpoint_path: NonEmptyStr = Field(description="Checkpoint (output) directory.")
    init_path: NonEmptyStr | None = Field(None, description="Checkpoint-like directory to start from.")
    checkpoint_preservation_interval: OptionalInt = Field(
        None, description="Keep a snapshot every this many epochs.")
    # training
    num_epochs: NonNegativeInt = Field(1, description="Passes over all edges.")
    num_edge_chunks: OptionalPositiveInt = Field(
        None, description="Chunks per bucket; null derives it from max_edges_per_chunk.")
    max_edges_per_chunk: PositiveInt = Field(
        1_000_000_000, description="Upper bound of edges per chunk when num_edge_chunks is null.")
    bucket_order: BucketOrder = Field("inside_out", description="Order of buckets within a chunk.")
    workers: OptionalPositiveInt = Field(None, description="Parallel workers; null means all cores.")
    batch_size: PositiveInt = Field(1000, description="Edges per batch.")
    num_batch_negs: NonNegativeInt = Field(50, description="Same-batch negatives per chunk.")
    num_uniform_negs: NonNegativeInt = Field(50, description="Uniform negatives per chunk.")
    disable_lhs_negs: Bool = Field(False, description="Do not corrupt the lhs.")
    disable_rhs_negs: Bool = Field(False, description="Do not corrupt the rhs.")
    lr: NonNegativeFloat = Field(0.01, description="Learning rate of embeddings.")
    relation_lr: OptionalNonNegativeFloat = Field(
        None, description="Learning rate of relation parameters; null means lr.")
    eval_fraction: Annotated[float, Field(ge=0, le=1), BeforeValidator(_as_float)] = Field(
        0.05, description="Fraction of each bucket held out for evaluation during training.")
    eval_num_batch_negs: OptionalNonNegativeInt = Field(1000, description="Batch negatives in eval.")
    eval_num_uniform_negs: OptionalNonNegativeInt = Field(
        1000, description="Uniform negatives in eval.")
    # expert
    background_io: Bool = Field(False, description="Deprecated; ignored.")
    verbose: NonNegativeInt = Field(0, description="Verbosity.")
    hogwild_delay: NonNegativeFloat = Field(2.0, description="Seconds before HOGWILD workers start.")
    dynamic_relations: Bool = Field(
        False, description="One operator with a relation axis; rel ids from dynamic_rel_count.txt.")
    # distributed and GPU
    num_machines: PositiveInt = Field(1, description="Machines in a distributed run.")
    num_partition_servers: Int = Field(
        -1, description="-1 one per trainer, 0 swap through disk, >0 external servers.")
    distributed_init_method: str | None = Field(None, description="torch.distributed init URL.")
    distributed_tree_init_order: Bool = Field(True, description="Bootstrap from partition 0.")
    num_gpus: NonNegativeInt = Field(0, description="GPUs to train on.")
    num_groups_for_partition_server: PositiveInt = Field(16, description="Partition server groups.")
    num_groups_per_sharded_partition_server: PositiveInt = Field(
        1, description="Groups per sharded partition server.")
    partition_shard_size: PositiveInt = Field(250, description="Partition shard size in MiB.")
    half_precision: Bool = Field(False, description="Train in half precision on GPU.")

    # The original's only Enum (any case); operator, comparator, loss_fn and regularizer are
    # names it looks up exactly.
    _lower_bucket_order = field_validator("bucket_order", mode="before")(_lower)

    # --- derived views -------------------------------------------------------------------
    def featurized_types(self) -> list[str]:
        """Names of the featurized entity types, sorted."""
        return sorted(name for name, entity in self.entities.items() if entity.featurized)

    def entity_dimension(self, entity_type: str) -> int:
        return self.entities[entity_type].dimension or self.dimension

    def num_partitions(self, entity_type: str) -> int:
        return self.entities[entity_type].num_partitions

    def bucket_grid(self) -> tuple[int, int]:
        """Number of lhs and rhs partitions (the shape of the bucket grid)."""
        lhs = {self.num_partitions(r.lhs) for r in self.relations} - {1}
        rhs = {self.num_partitions(r.rhs) for r in self.relations} - {1}
        return (max(lhs, default=1), max(rhs, default=1))

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        """``config.json`` as the original writes it (all keys, indent 4)."""
        return json.dumps(self.to_dict(), indent=CONFIG_JSON_INDENT)


CONFIG_KEYS = tuple(ConfigSchema.model_fields)
_ALL_KEYS = {
    (): CONFIG_KEYS,
    ("relations",): tuple(RelationSchema.model_fields),
    ("entities",): tuple(EntitySchema.model_fields),
}


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
    known: tuple[str, ...] = _ALL_KEYS.get(context[:1], ()) if context else CONFIG_KEYS
    if context[:1] == ("entities",):
        known = _ALL_KEYS[("entities",)]
    return f"unknown key {key!r}{did_you_mean(key, known)}"


_PYDANTIC_MESSAGES = {
    "missing": "is required",
    "too_short": "must not be empty",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than_equal": "must be at most {le}",
    "literal_error": "expected one of {expected}",
}


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
    return rule("config-schema").issue(None, _format_loc(loc), message)


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
        add("config-schema", "checkpoint_preservation_interval",
            "expected null or a non-zero integer (the original takes epoch % interval), found 0")
    if cfg.regularization_coef != 0 and cfg.regularizer not in REGULARIZERS:
        add("config-schema", "regularizer",
            f"expected one of {list(REGULARIZERS)} with regularization_coef={cfg.regularization_coef}, "
            f"found {cfg.regularizer!r}")
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
    """Negatives of featurized sides (seed 002) with ``batch_negs`` same-batch and ``uniform_negs``
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
                issues.append(rule("config-featurized-all-negs").issue(
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


def _key_paths(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The config's objects whose keys are settings (entity type names are data), with their paths."""
    yield "", data
    if isinstance(data.get("entities"), dict):
        for name, entity in data["entities"].items():
            if isinstance(entity, dict):
                yield f"entities.{name}.", entity
    if isinstance(data.get("relations"), list):
        for i, relation in enumerate(data["relations"]):
            if isinstance(relation, dict):
                yield f"relations[{i}].", relation


def snake_case_keys(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the mixedCase keys of the config, its entities and relations in snake_case,
    as the original's loader converts them (a later key wins over an earlier one that converts to
    the same name); entity type names, which are data, are kept as they are.

    >>> snake_case_keys({"numEpochs": 2, "entities": {"userId": {"numPartitions": 1}},
    ...                  "relations": [{"name": "r", "allNegs": True}]})
    {'num_epochs': 2, 'entities': {'userId': {'num_partitions': 1}}, 'relations': [{'name': 'r', 'all_negs': True}]}
    """
    def convert(node: Any) -> Any:
        return {_mixed_case_to_snake_case(k): v for k, v in node.items()} if isinstance(node, dict) else node

    out: dict[str, Any] = convert(data)
    if isinstance(out.get("entities"), dict):
        out["entities"] = {name: convert(entity) for name, entity in out["entities"].items()}
    if isinstance(out.get("relations"), list):
        out["relations"] = [convert(relation) for relation in out["relations"]]
    return out


def key_case_issues(data: Any) -> list[Issue]:
    """Warnings (rule ``config-key-mixedcase``) for the mixedCase keys of a raw config."""
    if not isinstance(data, dict):
        return []
    return [rule("config-key-mixedcase").issue(
        None, f"{path}{key}", f"expected snake_case keys, found {key!r}: read as {_mixed_case_to_snake_case(key)!r}, "
        "as the original reads it")
        for path, node in _key_paths(data) for key in node
        if isinstance(key, str) and _mixed_case_to_snake_case(key) != key]


def parse_config(data: Any, source: str = "<config>") -> ConfigSchema:
    """Validate a config dict; raise :class:`ConfigError` listing every problem. mixedCase keys
    are read as the original reads them (:func:`snake_case_keys`; :func:`key_case_issues` warns)."""
    if not isinstance(data, dict):
        raise ConfigError(source, [rule("config-unreadable").issue(
            source, None, f"expected a JSON object, found {type(data).__name__}")])
    try:
        cfg = ConfigSchema.model_validate(snake_case_keys(data))
    except ValidationError as exc:
        raise ConfigError(source, [_issue_from_pydantic(e) for e in exc.errors()]) from None
    errors = [i for i in semantic_issues(cfg) if i.severity == "error"]
    if errors:
        raise ConfigError(source, errors)
    return cfg


def read_config_json(path: str | AnyPath) -> Any:
    """The JSON value of a config file (a path or URL); :class:`ConfigError` when unreadable."""
    path = storage.resolve(path)
    try:
        with storage.remote_errors(path, "config"):
            return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, MissingArtifactError):
        raise ConfigError(str(path), [rule("config-unreadable").issue(
            str(path), None, "expected a config file, found nothing at this path")]) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: invalid JSON, or an integer of more digits than int() converts;
        # RecursionError: nesting deeper than the decoder recurses
        raise ConfigError(str(path), [rule("config-unreadable").issue(
            str(path), None, f"expected a JSON document, found {_json_failure(exc)}")]) from None


def _json_failure(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nesting too deep to decode"
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


def load_config(path: str | AnyPath) -> ConfigSchema:
    """Load and validate a JSON config file."""
    return parse_config(read_config_json(path), str(path))


def config_json_schema() -> dict[str, Any]:
    """The published JSON Schema of the run config."""
    schema = ConfigSchema.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://pbg.dev/schemas/config.schema.json",
        **schema,
    }
