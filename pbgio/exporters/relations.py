"""Relation operator parameters of a checkpoint version, as TSV (the original's layout) or JSON.

One record per (relation, side, parameter):

- static relations: the config's relations in order, right-hand side only (the original
  applies operators to the rhs), parameters ``relations/{i}/operator/rhs/{param}``;
- dynamic relations: the names of ``dynamic_rel_names.json`` in id order, both sides,
  row ``i`` of ``relations/0/operator/{side}/{param}`` (whose leading axis is the relation id).

TSV lines are ``name<TAB>side<TAB>operator<TAB>param<TAB>shape<TAB>v0<TAB>v1…`` with the
shape written ``AxB`` (``400`` for a vector) and values flattened in C order, each in its
shortest round-trip decimal form. JSON holds the same records with nested value lists.
Relations with the ``none`` operator have no parameters and no records.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl
from numpy.typing import NDArray

from pbgio.config import ConfigSchema
from pbgio.entities import read_relation_names
from pbgio.exporters.common import (
    ExportError,
    ExportReport,
    consistent_version,
    output_file,
)
from pbgio.layout import CheckpointVersion, Layout, open_checkpoint
from pbgio.spec.checkpoint import OPERATORS, operator_param_name
from pbgio.storage import AnyPath

RelationFormat = Literal["tsv", "json"]


@dataclass(frozen=True)
class RelationParameter:
    relation: str
    relation_id: int
    side: str
    operator: str
    param: str
    values: NDArray[np.float32]


def relation_parameters(source: CheckpointVersion) -> list[RelationParameter]:
    """Every operator parameter of every relation, per relation and side."""
    cfg = source.config
    params = source.checkpoint.read_model(source.version).params
    model_path = source.checkpoint.model_path(source.version)

    def get(name: str) -> NDArray[np.float32]:
        value = params.get(name)
        if value is None:
            raise ExportError(f"{model_path}: expected model/{name} (the config's operator), found none")
        return value

    records = []
    if cfg.dynamic_relations:
        relation = cfg.relations[0]
        names = read_relation_names(source.entity_path)
        for side in ("lhs", "rhs"):
            for pname in OPERATORS[relation.operator].dynamic_params:
                value = get(operator_param_name(0, side, pname))
                if value.shape[:1] != (len(names),):
                    raise ExportError(
                        f"{model_path}: expected {len(names)} relations (dynamic_rel_names.json) on the "
                        f"first axis of model/{operator_param_name(0, side, pname)}, found shape "
                        f"{value.shape}")
        for rel_id, name in enumerate(names):
            for side in ("lhs", "rhs"):
                for pname in OPERATORS[relation.operator].dynamic_params:
                    records.append(RelationParameter(name, rel_id, side, relation.operator, pname,
                                                     get(operator_param_name(0, side, pname))[rel_id]))
    else:
        for rel_id, relation in enumerate(cfg.relations):
            for pname in OPERATORS[relation.operator].static_params:
                records.append(RelationParameter(relation.name, rel_id, "rhs", relation.operator, pname,
                                                 get(operator_param_name(rel_id, "rhs", pname))))
    return records


@consistent_version
def export_relations(
    config: Layout | ConfigSchema | str | AnyPath,
    output: str | Path,
    *,
    fmt: RelationFormat = "tsv",
    version: int | None = None,
    checkpoint: str | AnyPath | None = None,
    base: str | AnyPath | None = None,
    overwrite: bool = False,
) -> ExportReport:
    """Write the relation operator parameters of ``version`` (default: the committed one)."""
    started = time.perf_counter()
    if fmt not in ("tsv", "json"):
        raise ExportError(f"expected a relation format among ('tsv', 'json'), found {fmt!r}")
    source = open_checkpoint(config, base=base, checkpoint=checkpoint, version=version, model=True)
    records = relation_parameters(source)
    output = Path(output)
    with output_file(output, overwrite) as tmp:
        if fmt == "tsv":
            tmp.write_text("".join(_tsv_line(r) for r in records), encoding="utf-8")
        else:
            tmp.write_text(_json_text(_json(source, records)), encoding="utf-8")
    report = ExportReport(version=source.version, outputs=[str(output)])
    report.rows["relations"] = len(records)
    report.seconds = time.perf_counter() - started
    return report


def _shape(values: NDArray[np.float32]) -> str:
    return "x".join(str(d) for d in values.shape)


def _tsv_line(record: RelationParameter) -> str:
    if any(c in record.relation for c in "\t\n\r"):
        raise ExportError(f"relation name {record.relation!r} holds a tab or a line break, which TSV cannot "
                          "hold; export to JSON instead")
    values = pl.Series(np.ascontiguousarray(record.values, dtype=np.float32).ravel()).cast(pl.String)
    fields = [record.relation, record.side, record.operator, record.param, _shape(record.values), *values]
    return "\t".join(fields) + "\n"


def _relations(source: CheckpointVersion) -> list[tuple[str, str]]:
    """(name, operator) of every relation id."""
    cfg = source.config
    if cfg.dynamic_relations:
        return [(name, cfg.relations[0].operator) for name in read_relation_names(source.entity_path)]
    return [(r.name, r.operator) for r in cfg.relations]


def _json(source: CheckpointVersion, records: list[RelationParameter]) -> dict[str, Any]:
    relations: list[dict[str, Any]] = [{"id": i, "name": name, "operator": op, "parameters": {}}
                 for i, (name, op) in enumerate(_relations(source))]
    for r in records:
        relations[r.relation_id]["parameters"].setdefault(r.side, {})[r.param] = {
            "shape": list(r.values.shape), "values": np.asarray(r.values, dtype=np.float32).tolist()}
    return {"checkpoint_version": source.version, "dynamic_relations": source.config.dynamic_relations,
            "relations": relations}


def _json_text(document: dict[str, Any]) -> str:
    """The document with one relation per line (compact values, still one JSON value)."""
    head = {k: v for k, v in document.items() if k != "relations"}
    lines = ",\n".join(json.dumps(r) for r in document["relations"])
    return json.dumps(head)[:-1] + ', "relations": [\n' + lines + "\n]}\n"
