"""The run config: every key, default and rule of the original PBG config.

One pydantic declaration (:class:`ConfigSchema`) gives the loader, the dumper
(``config.json`` exactly as the original writes it) and the published JSON
Schema ``schemas/config.schema.json``. Loading reports every problem at once,
each with its path:

>>> cfg = parse_config({
...     "entities": {"user": {"num_partitions": 2}},
...     "relations": [{"name": "follows", "lhs": "user", "rhs": "user"}],
...     "dimension": 16, "entity_path": "data", "edge_paths": ["data/train"],
...     "checkpoint_path": "model"})
>>> cfg.comparator, cfg.entity_dimension("user"), cfg.num_partitions("user")
('cos', 16, 2)
>>> try:
...     parse_config({"entities": {}, "relations": [{"name": "r", "lhs": "a", "rhs": "b",
...                    "operatr": "none"}], "dimension": 0, "numEpochs": 3})
... except ConfigError as e:
...     for issue in e.issues:
...         print(issue.dataset, "|", issue.message)
entities | must not be empty
relations[0].operatr | unknown key 'operatr' (did you mean 'operator'?)
dimension | must be greater than 0, found 0
entity_path | is required
edge_paths | is required
checkpoint_path | is required
numEpochs | unknown key 'numEpochs' (did you mean 'num_epochs'?)
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pbgio.errors import ConfigError, Issue
from pbgio.spec.checkpoint import CONFIG_JSON_INDENT
from pbgio.spec.naming import entity_type_name_problem
from pbgio.spec.rules import rule

Operator = Literal["none", "diagonal", "translation", "linear", "affine", "complex_diagonal"]
Comparator = Literal["dot", "cos", "l2", "squared_l2"]
LossFn = Literal["ranking", "logistic", "softmax"]
BucketOrder = Literal["random", "affinity", "inside_out", "outside_in"]
Regularizer = Literal["N3"]

NonEmptyStr = Annotated[str, Field(min_length=1)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class EntitySchema(_Strict):
    """One entity type."""

    num_partitions: PositiveInt = Field(
        description="Number of partitions of this type; 1 means unpartitioned.")
    featurized: bool = Field(
        False, description="Entities are bags of features; counts count features (seed 002).")
    dimension: PositiveInt | None = Field(
        None, description="Embedding dimension of this type; null means the global `dimension`.")


class RelationSchema(_Strict):
    """One relation type."""

    name: NonEmptyStr = Field(description="Relation name.")
    lhs: NonEmptyStr = Field(description="Entity type of the left-hand side.")
    rhs: NonEmptyStr = Field(description="Entity type of the right-hand side.")
    weight: PositiveFloat = Field(1.0, description="Multiplier of this relation's loss.")
    operator: Operator = Field("none", description="Operator applied to the rhs (both sides in dynamic mode).")
    all_negs: bool = Field(False, description="Use every entity of the partition as negatives.")

    _lower_operator = field_validator("operator", mode="before")(_lower)


class ConfigSchema(_Strict):
    """A PBG run config (the keys and defaults of the original, in its order)."""

    # model
    entities: dict[str, EntitySchema] = Field(
        min_length=1, description="Entity types by name.")
    relations: list[RelationSchema] = Field(min_length=1, description="Relation types, by index.")
    dimension: PositiveInt = Field(description="Embedding dimension.")
    init_scale: PositiveFloat = Field(1e-3, description="Std-dev of the normal initial embeddings.")
    max_norm: PositiveFloat | None = Field(None, description="Clip embedding norms to this value.")
    global_emb: bool = Field(True, description="Add a learned per-type vector to every embedding.")
    comparator: Comparator = Field("cos", description="Similarity of lhs and transformed rhs.")
    bias: bool = Field(False, description="Use embedding coordinate 0 as an additive bias.")
    loss_fn: LossFn = Field("ranking", description="Loss function.")
    margin: float = Field(0.1, description="Margin of the ranking loss.")
    regularization_coef: NonNegativeFloat = Field(0.0, description="Regularizer weight; 0 disables.")
    regularizer: Regularizer = Field("N3", description="Regularizer kind.")
    # data
    entity_path: NonEmptyStr = Field(description="Directory of entity counts and names.")
    edge_paths: list[NonEmptyStr] = Field(min_length=1, description="Directories of edge buckets.")
    checkpoint_path: NonEmptyStr = Field(description="Checkpoint (output) directory.")
    init_path: NonEmptyStr | None = Field(None, description="Checkpoint-like directory to start from.")
    checkpoint_preservation_interval: PositiveInt | None = Field(
        None, description="Keep a snapshot every this many epochs.")
    # training
    num_epochs: NonNegativeInt = Field(1, description="Passes over all edges.")
    num_edge_chunks: PositiveInt | None = Field(
        None, description="Chunks per bucket; null derives it from max_edges_per_chunk.")
    max_edges_per_chunk: PositiveInt = Field(
        1_000_000_000, description="Upper bound of edges per chunk when num_edge_chunks is null.")
    bucket_order: BucketOrder = Field("inside_out", description="Order of buckets within a chunk.")
    workers: PositiveInt | None = Field(None, description="Parallel workers; null means all cores.")
    batch_size: PositiveInt = Field(1000, description="Edges per batch.")
    num_batch_negs: NonNegativeInt = Field(50, description="Same-batch negatives per chunk.")
    num_uniform_negs: NonNegativeInt = Field(50, description="Uniform negatives per chunk.")
    disable_lhs_negs: bool = Field(False, description="Do not corrupt the lhs.")
    disable_rhs_negs: bool = Field(False, description="Do not corrupt the rhs.")
    lr: NonNegativeFloat = Field(0.01, description="Learning rate of embeddings.")
    relation_lr: NonNegativeFloat | None = Field(
        None, description="Learning rate of relation parameters; null means lr.")
    eval_fraction: Annotated[float, Field(ge=0, le=1)] = Field(
        0.05, description="Fraction of each bucket held out for evaluation during training.")
    eval_num_batch_negs: NonNegativeInt | None = Field(1000, description="Batch negatives in eval.")
    eval_num_uniform_negs: NonNegativeInt | None = Field(
        1000, description="Uniform negatives in eval.")
    # expert
    background_io: bool = Field(False, description="Deprecated; ignored.")
    verbose: NonNegativeInt = Field(0, description="Verbosity.")
    hogwild_delay: NonNegativeFloat = Field(2.0, description="Seconds before HOGWILD workers start.")
    dynamic_relations: bool = Field(
        False, description="One operator with a relation axis; rel ids from dynamic_rel_count.txt.")
    # distributed and GPU
    num_machines: PositiveInt = Field(1, description="Machines in a distributed run.")
    num_partition_servers: Annotated[int, Field(ge=-1)] = Field(
        -1, description="-1 one per trainer, 0 swap through disk, >0 external servers.")
    distributed_init_method: str | None = Field(None, description="torch.distributed init URL.")
    distributed_tree_init_order: bool = Field(True, description="Bootstrap from partition 0.")
    num_gpus: NonNegativeInt = Field(0, description="GPUs to train on.")
    num_groups_for_partition_server: PositiveInt = Field(16, description="Partition server groups.")
    num_groups_per_sharded_partition_server: PositiveInt = Field(
        1, description="Groups per sharded partition server.")
    partition_shard_size: PositiveInt = Field(250, description="Partition shard size in MiB.")
    half_precision: bool = Field(False, description="Train in half precision on GPU.")

    _lower_enums = field_validator("comparator", "loss_fn", "bucket_order", mode="before")(_lower)

    @field_validator("regularizer", mode="before")
    @classmethod
    def _canonical_regularizer(cls, value: Any) -> Any:
        return "N3" if isinstance(value, str) and value.upper() == "N3" else value

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


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _unknown_key_message(loc: tuple[int | str, ...]) -> str:
    key = str(loc[-1])
    context = tuple(p for p in loc[:-1] if isinstance(p, str))
    known: tuple[str, ...] = _ALL_KEYS.get(context[:1], ()) if context else CONFIG_KEYS
    if context[:1] == ("entities",):
        known = _ALL_KEYS[("entities",)]
    guess = _snake(key) if _snake(key) in known else None
    if guess is None:
        close = difflib.get_close_matches(key, known, n=1)
        guess = close[0] if close else None
    hint = f" (did you mean {guess!r}?)" if guess else ""
    return f"unknown key {key!r}{hint}"


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
    """Rules across keys (the original's load-time and run-time checks)."""
    issues: list[Issue] = []

    def add(rule_id: str, path: str, message: str) -> None:
        issues.append(rule(rule_id).issue(None, path, message))

    for name in cfg.entities:
        problem = entity_type_name_problem(name)
        if problem:
            add("entity-type-name-unsafe", f"entities.{name}",
                f"expected a name usable in file names, found {name!r}, which {problem}")
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
        if rel.operator != "complex_diagonal":
            continue
        for etype in {rel.lhs, rel.rhs} & set(cfg.entities):
            dim = cfg.entity_dimension(etype)
            if dim % 2:
                add("config-complex-odd-dimension", f"relations[{i}].operator",
                    f"expected an even dimension for complex_diagonal, found {dim} for {etype!r}")
    if cfg.num_batch_negs > 0 and cfg.batch_size % cfg.num_batch_negs:
        add("config-batch-negs-divide", "batch_size",
            f"expected a multiple of num_batch_negs={cfg.num_batch_negs}, found {cfg.batch_size}")
    if cfg.num_machines > 1 and all(e.num_partitions == 1 for e in cfg.entities.values()):
        add("config-machines-partitions", "num_machines",
            f"expected a partitioned entity type for num_machines={cfg.num_machines}, found none")
    _featurized_issues(cfg, add)
    if cfg.eval_fraction > 0:
        issues += featurized_eval_issues(cfg, "with eval_fraction > 0")
    if cfg.loss_fn == "logistic" and cfg.comparator == "cos":
        add("config-logistic-cos", "loss_fn",
            "expected a comparator other than cos with the logistic loss, found cos")
    return issues


def _featurized_issues(cfg: ConfigSchema, add: Callable[[str, str, str], None]) -> None:
    """Seed 002: featurized entities take same-batch negatives only (evaluation: :func:`featurized_eval_issues`)."""
    featurized = cfg.featurized_types()
    if not featurized:
        return
    why = f"entity type {featurized[0]!r} is featurized (featurized types take same-batch negatives only"
    if cfg.num_uniform_negs != 0:
        add("config-featurized-uniform-negs", "num_uniform_negs",
            f"expected 0 because {why}, so uniform sampling is disabled globally), found {cfg.num_uniform_negs}")
    if cfg.num_batch_negs <= 0:
        add("config-featurized-batch-negs", "num_batch_negs",
            f"expected > 0 because {why}), found {cfg.num_batch_negs}")
    for i, rel in enumerate(cfg.relations):
        sides = [t for t in (rel.lhs, rel.rhs) if t in featurized]
        if rel.all_negs and sides:
            add("config-featurized-all-negs", f"relations[{i}].all_negs",
                f"expected false because entity type {sides[0]!r} of relation {rel.name!r} is featurized "
                "(featurized types take same-batch negatives only), found true")


def featurized_eval_issues(cfg: ConfigSchema, when: str) -> list[Issue]:
    """Evaluating featurized types takes same-batch candidates only: the effective
    ``eval_num_uniform_negs`` is 0 and ``eval_num_batch_negs`` > 0 (a null eval key takes the
    training one). ``when`` says when evaluation happens ("with eval_fraction > 0")."""
    featurized = cfg.featurized_types()
    if not featurized:
        return []
    why = f"entity type {featurized[0]!r} is featurized (featurized types take same-batch negatives only)"
    uniform = cfg.num_uniform_negs if cfg.eval_num_uniform_negs is None else cfg.eval_num_uniform_negs
    batch = cfg.num_batch_negs if cfg.eval_num_batch_negs is None else cfg.eval_num_batch_negs
    if uniform != 0:
        return [rule("config-featurized-eval-negs").issue(
            None, "eval_num_uniform_negs", f"expected 0 {when} because {why}, found {uniform}")]
    if batch <= 0:
        return [rule("config-featurized-eval-negs").issue(
            None, "eval_num_batch_negs", f"expected > 0 {when} because {why}, found {batch}")]
    return []


def parse_config(data: Any, source: str = "<config>") -> ConfigSchema:
    """Validate a config dict; raise :class:`ConfigError` listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError(source, [rule("config-unreadable").issue(
            source, None, f"expected a JSON object, found {type(data).__name__}")])
    try:
        cfg = ConfigSchema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [_issue_from_pydantic(e) for e in exc.errors()]) from None
    errors = [i for i in semantic_issues(cfg) if i.severity == "error"]
    if errors:
        raise ConfigError(source, errors)
    return cfg


def read_config_json(path: str | Path) -> Any:
    """The JSON value of a config file; :class:`ConfigError` when unreadable."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(path), [rule("config-unreadable").issue(
            str(path), None, "expected a config file, found nothing at this path")]) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(str(path), [rule("config-unreadable").issue(
            str(path), None, f"expected a JSON document, found {exc}")]) from None


def load_config(path: str | Path) -> ConfigSchema:
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
