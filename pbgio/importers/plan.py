"""What a config asks of an import, and the per-row checks that follow from it.

Static relations (``dynamic_relations: false``) take the config's relations by name, in
order: a relation name that is not in the config makes the row malformed. Each row's
entity types are those of its relation. Dynamic relations take any name; the relation
dictionary is built from the input, and every edge has the types of the config's one
relation.

A featurized entity type reads its cell as a list of features (document -> words);
its dictionary holds features, and such a type must have one partition (a bag's
features would otherwise span partitions).

>>> from pbgio.config import parse_config
>>> cfg = parse_config({"entities": {"user": {"num_partitions": 2}, "item": {"num_partitions": 1}},
...     "relations": [{"name": "follows", "lhs": "user", "rhs": "user"},
...                   {"name": "buys", "lhs": "user", "rhs": "item"}],
...     "dimension": 8, "entity_path": "e", "edge_paths": ["t"], "checkpoint_path": "c"})
>>> plan = ImportPlan.build(cfg, has_rel_column=True, feature_separator=" ")
>>> plan.side_types("rhs"), plan.distinct_types("lhs"), plan.grid
(['user', 'item'], ['user'], (2, 2))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import polars as pl

from pbgio.config import ConfigSchema
from pbgio.errors import PbgioError
from pbgio.importers.read import Check, Source, message, problem_code
from pbgio.names import names_command

Side = Literal["lhs", "rhs"]
SIDES: tuple[Side, Side] = ("lhs", "rhs")
MAX_NAMES_SHOWN = 5


class ImportSetupError(PbgioError, ValueError):
    """The config, the options and the inputs cannot make an import (before any row is read)."""


MAX_BUCKETS = 1 << 20
"""The most buckets an import writes into an edge path (1,024 partitions a side): a config from someone else
cannot make it create files without end (docs/security.md). The largest graphs trained with PBG used tens."""


@dataclass(frozen=True)
class ImportPlan:
    config: ConfigSchema
    has_rel_column: bool
    feature_separator: str

    @classmethod
    def build(cls, config: ConfigSchema, *, has_rel_column: bool, feature_separator: str) -> ImportPlan:
        plan = cls(config, has_rel_column, feature_separator)
        if config.dynamic_relations and not has_rel_column:
            raise ImportSetupError("expected a relation column with dynamic_relations (relation names are "
                                   "read from it), found none")
        if not config.dynamic_relations:
            if not has_rel_column and len(config.relations) > 1:
                raise ImportSetupError(f"expected a relation column for a config with "
                                       f"{len(config.relations)} relations, found none")
            names = [r.name for r in config.relations]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes and has_rel_column:
                raise ImportSetupError(f"expected unique relation names to map the relation column, "
                                       f"found {dupes} repeated in the config")
        for name, entity in config.entities.items():
            if entity.featurized and entity.num_partitions != 1:
                raise ImportSetupError(f"expected featurized entity type {name!r} to have 1 partition (the "
                                       f"features of a bag must share one), found {entity.num_partitions}")
        lhs_parts, rhs_parts = config.bucket_grid()
        if lhs_parts * rhs_parts > MAX_BUCKETS:  # every bucket is a file, empty ones too: bounded before any is made
            raise ImportSetupError(f"num_partitions: expected a partition grid of at most {MAX_BUCKETS:,} buckets "
                                   f"an edge path, found {lhs_parts:,} x {rhs_parts:,} = {lhs_parts * rhs_parts:,} "
                                   "(every bucket is a file, empty ones too)")
        return plan

    @property
    def dynamic(self) -> bool:
        return self.config.dynamic_relations

    @property
    def types(self) -> list[str]:
        return list(self.config.entities)

    @property
    def grid(self) -> tuple[int, int]:
        return self.config.bucket_grid()

    def side_types(self, side: Side) -> list[str]:
        """Entity type of ``side`` per relation id (one entry in dynamic mode)."""
        rels = self.config.relations[:1] if self.dynamic else self.config.relations
        return [getattr(r, side) for r in rels]

    def distinct_types(self, side: Side) -> list[str]:
        return list(dict.fromkeys(self.side_types(side)))

    def featurized(self, entity_type: str) -> bool:
        return self.config.entities[entity_type].featurized

    def has_features(self, side: Side) -> bool:
        return any(self.featurized(t) for t in self.distinct_types(side))

    def static_names(self) -> list[str]:
        return [r.name for r in self.config.relations]


@dataclass(frozen=True)
class RelationMap:
    """How relation names become ids for one pass over the inputs.

    ``names`` is None in the first pass of dynamic mode (relations are only counted);
    ``unknown_is_problem`` is true for static relations; ``kept`` restricts the ids
    (relations dropped by the minimum count).
    """

    names: list[str] | None
    unknown_is_problem: bool
    kept: frozenset[int] | None = None


@dataclass(frozen=True)
class Checked:
    """A source's rows with relation ids, types, bags and problem codes; ``checks`` name the codes."""

    source: Source
    transform: Callable[[pl.LazyFrame], pl.LazyFrame]
    checks: tuple[Check, ...]

    def batches(self, then: Callable[[pl.LazyFrame], pl.LazyFrame] | None = None,
                on_block: Callable[[float], None] | None = None) -> Iterator[pl.DataFrame]:
        """The checked rows block by block, in file order (``then`` refines each block's query);
        ``on_block`` hears the share of the file read after each block."""
        for block in self.source.blocks():
            lf = self.transform(block.frame)
            yield (lf if then is None else then(lf)).collect()
            if on_block is not None:
                on_block(block.done)


def checked_frame(source: Source, plan: ImportPlan, relations: RelationMap) -> Checked:
    """The source's rows with ``rel_id``, per-side types and feature bags, and every problem.

    Adds ``rel_id`` (Int64; null for a dynamic relation outside ``names``), ``{side}_type``
    (the index of the type in ``plan.types``, only where a side has several types) and
    ``{side}_bag`` (the feature list, on sides with featurized types), and folds the
    relation and bag problems into ``problem``.
    """
    checks = list(source.checks)
    extra: list[Check] = []
    columns: list[pl.Expr] = []  # added in order: later ones may use earlier ones

    def add(condition: pl.Expr, msg: pl.Expr) -> None:
        extra.append(Check(len(checks) + len(extra), condition, msg))

    if relations.names is not None:
        if not plan.has_rel_column:
            rel_id = pl.lit(0, dtype=pl.Int64)
        elif not relations.names:
            rel_id = pl.lit(None, dtype=pl.Int64)
        else:
            rel_id = pl.col("rel").cast(pl.Enum(relations.names), strict=False).to_physical().cast(pl.Int64)
        columns.append(rel_id.alias("rel_id"))
        if relations.unknown_is_problem and plan.has_rel_column:
            shown = ", ".join(repr(n) for n in relations.names[:MAX_NAMES_SHOWN])
            hidden = len(relations.names) - MAX_NAMES_SHOWN
            more = f", … ({hidden:,} more: {names_command(None)})" if hidden > 0 else ""
            add(pl.col("rel_id").is_null(),
                message(f"expected a relation of the config ({shown}{more}), found '", pl.col("rel"), "'"))
    type_index = {t: i for i, t in enumerate(plan.types)}
    for side in SIDES:
        per_rel = plan.side_types(side)
        distinct = plan.distinct_types(side)
        if len(distinct) > 1:
            columns.append(pl.col("rel_id").replace_strict(
                list(range(len(per_rel))), [type_index[t] for t in per_rel], default=None,
                return_dtype=pl.Int32).alias(f"{side}_type"))
        if side in source.list_columns and not all(plan.featurized(t) for t in distinct):
            plain = [t for t in distinct if not plan.featurized(t)]
            raise ImportSetupError(f"{source.path}: expected names in {source.columns[side]} ({side}), found "
                                   f"lists, which only featurized entity types take ({plain} are not)")
        if not plan.has_features(side):
            continue
        raw = pl.col(side) if side in source.list_columns else pl.col(side).str.split(plan.feature_separator)
        bag = raw.list.eval(pl.element().filter(pl.element().is_not_null() & (pl.element() != "")))
        featurized = is_featurized(plan, side)
        columns.append((bag if featurized is None else pl.when(featurized).then(bag)).alias(f"{side}_bag"))
        empty = pl.col(f"{side}_bag").list.len() == 0
        add(empty if featurized is None else featurized & empty,
            message(f"expected at least one feature in {source.columns[side]} ({side}) for a featurized "
                    "entity type, found none"))
    if extra:
        columns.append(pl.coalesce([pl.col("problem"), problem_code(extra)]).alias("problem"))

    def transform(lf: pl.LazyFrame) -> pl.LazyFrame:
        for column in columns:
            lf = lf.with_columns(column)
        return lf

    return Checked(source, transform, (*checks, *extra))


def is_featurized(plan: ImportPlan, side: Side) -> pl.Expr | None:
    """Rows whose ``side`` is featurized: None when all are, ``lit(False)`` when none is."""
    distinct = plan.distinct_types(side)
    feats = [plan.types.index(t) for t in distinct if plan.featurized(t)]
    if len(feats) == len(distinct):
        return None
    if not feats:
        return pl.lit(False)
    return pl.col(f"{side}_type").is_in(feats)


def relation_filter(relations: RelationMap) -> pl.Expr:
    """Rows whose relation is known and kept (for passes after the relation dictionary)."""
    keep = pl.col("rel_id").is_not_null()
    if relations.kept is not None:
        keep &= pl.col("rel_id").is_in(sorted(relations.kept))
    return keep
