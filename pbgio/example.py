"""A small, deterministic example layout with planted structure.

Users belong to hidden communities; they follow users and like items of their
own community. ``user`` has 2 partitions and ``item`` one, so the layout
exercises partitioned buckets, an unpartitioned type spread over all buckets,
names files and two operators. ``edges/test`` holds held-out edges drawn the same
way, for evaluation (it is not among the config's ``edge_paths``).

>>> import tempfile, pathlib
>>> from pbgio.validate import validate_path
>>> config = build_example(pathlib.Path(tempfile.mkdtemp()), num_edges=300)
>>> validate_path(config).ok
True
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from pbgio.config import ConfigSchema, parse_config
from pbgio.edges import EdgeBucket, write_bucket
from pbgio.entities import write_entity_count, write_entity_names, write_relation_names
from pbgio.spec import naming

NUM_USERS = 60
NUM_ITEMS = 40
NUM_COMMUNITIES = 4
USER_PARTITIONS = 2
TEST_EDGE_PATH = "edges/test"
"""Held-out edges (a tenth of the training count), outside the config's edge_paths."""


def example_config() -> ConfigSchema:
    return parse_config({
        "entities": {"user": {"num_partitions": USER_PARTITIONS}, "item": {"num_partitions": 1}},
        "relations": [
            {"name": "follows", "lhs": "user", "rhs": "user", "operator": "translation"},
            {"name": "likes", "lhs": "user", "rhs": "item", "operator": "diagonal"},
        ],
        "dimension": 16,
        "entity_path": "entities",
        "edge_paths": ["edges/train"],
        "checkpoint_path": "checkpoint",
        "comparator": "dot",
        "loss_fn": "softmax",
        "num_epochs": 10,
        "batch_size": 100,
        "num_batch_negs": 50,
        "num_uniform_negs": 50,
        # With 30 users per partition, 1,000 uniform eval negatives would mostly repeat the
        # positive itself; the example is evaluated on edges/test against all entities instead.
        "eval_fraction": 0,
    }, "example")


def build_example(dest: Path, *, num_edges: int = 20_000, seed: int = 0) -> Path:
    """Write the example layout under ``dest``; return the path of its config.json."""
    rng = np.random.default_rng(seed)
    cfg = example_config()
    dest.mkdir(parents=True, exist_ok=True)
    entity_path = dest / cfg.entity_path
    per_part = NUM_USERS // USER_PARTITIONS
    user_names = [f"user{i:03d}" for i in range(NUM_USERS)]
    for part in range(USER_PARTITIONS):
        write_entity_count(entity_path, "user", part, per_part)
        write_entity_names(entity_path, "user", part, user_names[part * per_part:(part + 1) * per_part])
    write_entity_count(entity_path, "item", 0, NUM_ITEMS)
    write_entity_names(entity_path, "item", 0, [f"item{i:03d}" for i in range(NUM_ITEMS)])
    write_relation_names(entity_path, [r.name for r in cfg.relations])

    user_comm = rng.integers(0, NUM_COMMUNITIES, NUM_USERS)
    item_comm = np.arange(NUM_ITEMS) % NUM_COMMUNITIES
    _write_edges(dest / cfg.edge_paths[0], num_edges, user_comm, item_comm, rng)
    _write_edges(dest / TEST_EDGE_PATH, max(1, num_edges // 10), user_comm, item_comm, rng)
    config_path = dest / naming.CONFIG_JSON
    config_path.write_text(cfg.to_json() + "\n", encoding="utf-8")
    return config_path


def _write_edges(edge_path: Path, num_edges: int, user_comm: NDArray[np.int64], item_comm: NDArray[np.int64],
                 rng: np.random.Generator) -> None:
    """Edges mostly inside a community: 90% of rhs are drawn from the lhs user's community."""
    per_part = NUM_USERS // USER_PARTITIONS
    rel = rng.integers(0, 2, num_edges)
    lhs = rng.integers(0, NUM_USERS, num_edges)
    rhs = np.empty(num_edges, dtype=np.int64)
    for r, (pool_comm, size) in enumerate(((user_comm, NUM_USERS), (item_comm, NUM_ITEMS))):
        rows = np.flatnonzero(rel == r)
        for i in rows:
            same = np.flatnonzero(pool_comm == user_comm[lhs[i]])
            rhs[i] = rng.choice(same) if rng.random() < 0.9 else rng.integers(0, size)
    lhs_part, lhs_off = lhs // per_part, lhs % per_part
    # Users are partitioned; items are not, so their edges spread over every rhs bucket.
    rhs_part = np.where(rel == 0, rhs // per_part, rng.integers(0, USER_PARTITIONS, num_edges))
    rhs_off = np.where(rel == 0, rhs % per_part, rhs)
    for lp in range(USER_PARTITIONS):
        for rp in range(USER_PARTITIONS):
            sel = (lhs_part == lp) & (rhs_part == rp)
            write_bucket(edge_path / naming.bucket_file(lp, rp),
                         EdgeBucket(rel=rel[sel], lhs=lhs_off[sel], rhs=rhs_off[sel]))
