"""Read a layout's edges back as names: the inverse of an import, for round-trip tests.

Each edge becomes ``(lhs, relation, rhs, weight)``, where a plain entity is its name
(from ``entity_names_*.json``), a featurized entity is the tuple of its feature names,
the relation is its name (config relations, or ``dynamic_rel_names.json``) and the
weight is a float or None.

>>> import json, tempfile, pathlib
>>> from pbgio.importers import import_edge_lists
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> _ = (root / "config.json").write_text(json.dumps({
...     "entities": {"n": {"num_partitions": 2}}, "relations": [{"name": "r", "lhs": "n", "rhs": "n"}],
...     "dimension": 4, "entity_path": "data", "edge_paths": ["data/train"], "checkpoint_path": "model"}))
>>> _ = (root / "train.tsv").write_text("a\\tr\\tb\\nb\\tr\\tc\\n")
>>> _ = import_edge_lists(root / "config.json", [root / "train.tsv"])
>>> sorted(layout_edges(root / "config.json")["data/train"])
[('a', 'r', 'b', None), ('b', 'r', 'c', None)]
"""

from __future__ import annotations

from typing import Any

from pbgio import storage
from pbgio.config import ConfigSchema
from pbgio.edges import read_bucket
from pbgio.entities import read_entity_names, read_relation_names
from pbgio.layout import Layout
from pbgio.spec import naming
from pbgio.storage import AnyPath

Edge = tuple[Any, str, Any, float | None]


def layout_edges(config_path: AnyPath, base: AnyPath | None = None) -> dict[str, list[Edge]]:
    """Every edge of every edge path (keyed as written in the config), as names."""
    layout = Layout.load(config_path, base=base)
    return edges_as_names(layout.config, layout.base)


def edges_as_names(cfg: ConfigSchema, base: AnyPath) -> dict[str, list[Edge]]:
    entity_path = storage.resolve(cfg.entity_path, base)
    names = {(t, p): read_entity_names(entity_path, t, p)
             for t, e in cfg.entities.items() for p in range(e.num_partitions)}
    relations = (read_relation_names(entity_path) if cfg.dynamic_relations
                 else [r.name for r in cfg.relations])
    lhs_parts, rhs_parts = cfg.bucket_grid()
    found: dict[str, list[Edge]] = {}
    for edge_path in cfg.edge_paths:
        edges: list[Edge] = []
        directory = storage.resolve(edge_path, base)
        for lhs_part in range(lhs_parts):
            for rhs_part in range(rhs_parts):
                bucket = read_bucket(directory / naming.bucket_file(lhs_part, rhs_part))
                for i in range(len(bucket)):
                    rel = int(bucket.rel[i])
                    relation = cfg.relations[0] if cfg.dynamic_relations else cfg.relations[rel]
                    ends: list[Any] = []
                    for side, part in (("lhs", lhs_part), ("rhs", rhs_part)):
                        entity_type = getattr(relation, side)
                        own = part if cfg.entities[entity_type].num_partitions > 1 else 0
                        feats = bucket.features(side)  # type: ignore[arg-type]
                        if cfg.entities[entity_type].featurized:
                            assert feats is not None
                            ends.append(tuple(names[(entity_type, 0)][f] for f in feats.bag(i).tolist()))
                        else:
                            ends.append(names[(entity_type, own)][int(getattr(bucket, side)[i])])
                    weight = None if bucket.weight is None else float(bucket.weight[i])
                    edges.append((ends[0], relations[rel], ends[1], weight))
        found[edge_path] = edges
    return found
