"""The run config's schema: every key, default and type of the original PBG config.

One pydantic declaration (:class:`ConfigSchema`) gives the loader (:func:`pbgio.config.parse_config`),
the dumper (``config.json`` exactly as the original writes it) and the published JSON Schema
``schemas/config.schema.json``; :mod:`pbgio.checks.config` holds the rules across keys. It is
part of the format's declaration, so that the checks (which take a parsed config) need not
import the loader. :mod:`pbgio.config` re-exports every public name.

>>> ConfigSchema.model_validate({"entities": {"user": {"num_partitions": 2}},
...     "relations": [{"name": "follows", "lhs": "user", "rhs": "user"}], "dimension": 16,
...     "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model"}).bucket_grid()
(2, 2)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from pbgio.spec.config_keys import mixed_case_to_snake_case

CONFIG_JSON_INDENT = 4
"""``config.json`` (and the config/json attribute of checkpoint files) as the original writes it."""

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
        False, description="Entities are bags of features; counts count features (docs/guides/featurized.md).")
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
KEYS_BY_OBJECT: dict[tuple[str, ...], tuple[str, ...]] = {
    (): CONFIG_KEYS,
    ("relations",): tuple(RelationSchema.model_fields),
    ("entities",): tuple(EntitySchema.model_fields),
}


def key_paths(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
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
        return {mixed_case_to_snake_case(k): v for k, v in node.items()} if isinstance(node, dict) else node

    out: dict[str, Any] = convert(data)
    if isinstance(out.get("entities"), dict):
        out["entities"] = {name: convert(entity) for name, entity in out["entities"].items()}
    if isinstance(out.get("relations"), list):
        out["relations"] = [convert(relation) for relation in out["relations"]]
    return out
