"""A partitioned graph with planted communities, of any size: for distributed tests and benchmarks.

One entity type ``node`` in ``num_partitions`` partitions (node ``i`` lives in partition
``i % num_partitions``), ``num_relations`` relations ``node → node``; each edge's rhs is drawn
from the lhs's community with probability ``affinity``, else uniformly, so a trained model
ranks true edges far above chance. ``edges/train`` (in the config) and ``edges/test``
(held out, a tenth as many) are written by pbgio, vectorized (10M edges take seconds).

>>> import tempfile, pathlib
>>> from pbgio.validate import validate_path
>>> config = planted_graph(pathlib.Path(tempfile.mkdtemp()), num_partitions=4, num_nodes=200, num_edges=2000)
>>> validate_path(config).ok
True
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pbgio.config import parse_config
from pbgio.edges import EdgeBucket, write_bucket
from pbgio.entities import write_entity_count, write_relation_names
from pbgio.spec import naming

TEST_EDGE_PATH = "edges/test"


def planted_config(num_partitions: int, num_relations: int = 2, **overrides: Any) -> dict[str, Any]:
    """The config of :func:`planted_graph` (``overrides`` replace its keys)."""
    raw: dict[str, Any] = {
        "entities": {"node": {"num_partitions": num_partitions}},
        "relations": [{"name": f"r{k}", "lhs": "node", "rhs": "node", "operator": "translation"}
                      for k in range(num_relations)],
        "dimension": 16, "entity_path": "entities", "edge_paths": ["edges/train"],
        "checkpoint_path": "checkpoint", "comparator": "dot", "loss_fn": "softmax", "num_epochs": 5,
        "batch_size": 200, "num_batch_negs": 50, "num_uniform_negs": 50, "eval_fraction": 0,
        "lr": 0.1, "hogwild_delay": 0,
    }
    raw.update(overrides)
    parse_config(raw, "planted")  # fail here, not later, on a bad override
    return raw


def planted_graph(dest: Path, *, num_partitions: int = 4, num_nodes: int = 1000, num_edges: int = 20_000,
                  num_relations: int = 2, num_communities: int = 8, affinity: float = 0.9, seed: int = 0,
                  **config_overrides: Any) -> Path:
    """Write the graph and its config under ``dest``; return the config's path."""
    if num_nodes < num_partitions:
        raise ValueError(f"expected at least one node per partition, found {num_nodes} for {num_partitions}")
    rng = np.random.default_rng(seed)
    raw = planted_config(num_partitions, num_relations, **config_overrides)
    dest.mkdir(parents=True, exist_ok=True)
    entity_path = dest / raw["entity_path"]
    for part in range(num_partitions):
        write_entity_count(entity_path, "node", part, len(range(part, num_nodes, num_partitions)))
    write_relation_names(entity_path, [r["name"] for r in raw["relations"]])
    community = rng.integers(0, num_communities, num_nodes)
    members = [np.flatnonzero(community == c) for c in range(num_communities)]
    for path, count in ((raw["edge_paths"][0], num_edges), (TEST_EDGE_PATH, max(1, num_edges // 10))):
        _write_edges(dest / path, count, num_nodes, num_partitions, num_relations, community, members,
                     affinity, rng)
    config_path = dest / naming.CONFIG_JSON
    config_path.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    return config_path


def _write_edges(edge_path: Path, num_edges: int, num_nodes: int, num_partitions: int, num_relations: int,
                 community: np.ndarray, members: list[np.ndarray], affinity: float,
                 rng: np.random.Generator) -> None:
    lhs = rng.integers(0, num_nodes, num_edges)
    rel = rng.integers(0, num_relations, num_edges)
    rhs = rng.integers(0, num_nodes, num_edges)
    inside = rng.random(num_edges) < affinity
    inside_rows = np.flatnonzero(inside)  # grouped by the lhs's community, in row order within each
    lhs_community = community[lhs[inside_rows]]
    order = np.argsort(lhs_community, kind="stable")
    by_community = inside_rows[order]
    bounds = np.searchsorted(lhs_community[order], np.arange(len(members) + 1))
    for c, nodes in enumerate(members):
        if len(nodes) == 0:
            continue
        rows = by_community[bounds[c]:bounds[c + 1]]
        rhs[rows] = nodes[rng.integers(0, len(nodes), len(rows))]
    lhs_part, rhs_part = lhs % num_partitions, rhs % num_partitions
    order = np.lexsort((rhs_part, lhs_part))
    lhs, rhs, rel, lhs_part, rhs_part = lhs[order], rhs[order], rel[order], lhs_part[order], rhs_part[order]
    bounds = np.searchsorted(lhs_part * num_partitions + rhs_part, np.arange(num_partitions ** 2 + 1))
    for lp in range(num_partitions):
        for rp in range(num_partitions):
            start, end = bounds[lp * num_partitions + rp], bounds[lp * num_partitions + rp + 1]
            write_bucket(edge_path / naming.bucket_file(lp, rp),
                         EdgeBucket(rel=rel[start:end], lhs=lhs[start:end] // num_partitions,
                                    rhs=rhs[start:end] // num_partitions))
