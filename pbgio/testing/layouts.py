"""A complete, valid current layout in memory, and how to write it through pbgio's writers.

:class:`LayoutContents` holds a config (paths relative to the layout root), entity counts and names,
relation names, the edge buckets of every edge path and an optional committed checkpoint.
:func:`write_layout` writes it under a root directory, plus ``root/config.json``:

>>> import tempfile, pathlib
>>> from pbgio.validate import validate_path
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> config_path = write_layout(root, small_valid_layout())
>>> config_path.name, validate_path(config_path).issues
('config.json', [])

:func:`small_valid_layout` builds a deterministic, rich layout (partitioned and unpartitioned
types, a featurized type, weights, names, a checkpoint) used as the valid starting point of the
mutation tests in :mod:`pbgio.testing.mutations`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pbgio import entities
from pbgio.checkpoint import (
    CheckpointDir,
    EmbeddingsState,
    FileMetadata,
    IterationInfo,
    ModelState,
    write_checkpoint,
)
from pbgio.config import ConfigSchema, parse_config
from pbgio.deprecation import renamed_names
from pbgio.edges import EdgeBucket, FeatureLists, write_bucket
from pbgio.optimizer_state import encode_adagrad, encode_row_adagrad
from pbgio.spec import naming
from pbgio.spec.checkpoint import expected_model_params
from pbgio.storage import atomic

Part = tuple[str, int]
BucketKey = tuple[int, int]


@dataclass
class CheckpointContents:
    """One committed checkpoint version (N >= 1) and what lives beside it."""

    version: int
    embeddings: dict[Part, EmbeddingsState]
    model: ModelState
    metadata: FileMetadata
    snapshot_epoch: int | None = None
    stats: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LayoutContents:
    """A complete valid current layout in memory.

    ``config`` uses relative paths (resolved against the root :func:`write_layout` is given).
    ``buckets`` maps each edge path of the config to its buckets by ``(lhs, rhs)`` partition;
    every bucket of the grid must be there (empty buckets too).
    """

    config: ConfigSchema
    counts: dict[Part, int]
    names: dict[Part, list[str]] = field(default_factory=dict)
    dynamic_rel_count: int | None = None
    relation_names: list[str] | None = None
    buckets: dict[str, dict[BucketKey, EdgeBucket]] = field(default_factory=dict)
    checkpoint: CheckpointContents | None = None

    @property
    def num_relations(self) -> int:
        if self.config.dynamic_relations:
            return self.dynamic_rel_count or 0
        return len(self.config.relations)

    def count(self, entity_type: str, part: int) -> int:
        return self.counts[(entity_type, part)]


# --------------------------------------------------------------------------- config helpers


__getattr__ = renamed_names(__name__, {"Layout": "LayoutContents", "CheckpointLayout": "CheckpointContents"})
"""The names of :class:`LayoutContents` and :class:`CheckpointContents` before they were renamed (they
said "layout", as :class:`pbgio.layout.Layout` does), kept for one release."""


def expected_params(config: ConfigSchema,
                    num_dynamic_rels: int | None) -> dict[str, tuple[int, ...]]:
    """Public names and shapes of every model parameter ``config`` implies: the spec's
    :func:`~pbgio.spec.checkpoint.expected_model_params`, with an unknown number of dynamic
    relations taken as 0 (so every shape is known).

    >>> from pbgio.config import parse_config
    >>> cfg = parse_config({"entities": {"e": {"num_partitions": 1}}, "dimension": 4,
    ...                     "relations": [{"name": "r", "lhs": "e", "rhs": "e", "operator": "diagonal"}],
    ...                     "entity_path": "x", "edge_paths": ["z"], "checkpoint_path": "y"})
    >>> expected_params(cfg, None)
    {'relations/0/operator/rhs/diagonal': (4,), 'entities/e/global_embedding': (4,)}
    """
    known = expected_model_params(config, num_dynamic_rels or 0)
    return {name: shape for name, shape in known.items() if shape is not None}


def all_parts(config: ConfigSchema) -> list[Part]:
    """Every ``(type, part)`` of the config, in config order."""
    return [(t, p) for t, e in config.entities.items() for p in range(e.num_partitions)]


def grid(config: ConfigSchema) -> list[BucketKey]:
    """Every bucket ``(lhs, rhs)`` of the partition grid."""
    lhs_parts, rhs_parts = config.bucket_grid()
    return [(lhs, rhs) for lhs in range(lhs_parts) for rhs in range(rhs_parts)]


def side_part(config: ConfigSchema, entity_type: str, bucket_part: int) -> int | None:
    """Partition of ``entity_type`` whose entities sit in a bucket's ``bucket_part``, or None.

    A partitioned type's partition is the bucket's; an unpartitioned type lives in partition 0,
    and its edges go to buckets of partition 0 on that side (as the original importer puts them).
    """
    if config.num_partitions(entity_type) > 1:
        return bucket_part
    return 0 if bucket_part == 0 else None


def relation_types(config: ConfigSchema, rel_id: int) -> tuple[str, str]:
    """``(lhs type, rhs type)`` of relation id ``rel_id`` (dynamic ids all use relation 0)."""
    rel = config.relations[0 if config.dynamic_relations else rel_id]
    return rel.lhs, rel.rhs


def iteration_info(config: ConfigSchema, version: int) -> IterationInfo:
    """The iteration whose end writes ``version`` (iteration index ``version - 1``).

    Iterations run over (epoch, edge path, chunk), the chunk varying fastest.
    """
    chunks = config.num_edge_chunks or 1
    paths = len(config.edge_paths)
    index = max(version - 1, 0)
    chunk_idx = index % chunks
    path_idx = (index // chunks) % paths
    epoch_idx = index // (chunks * paths)
    return IterationInfo(
        num_epochs=config.num_epochs,
        epoch_idx=epoch_idx,
        num_edge_paths=paths,
        edge_path_idx=path_idx,
        edge_path=config.edge_paths[path_idx],
        num_edge_chunks=chunks,
        edge_chunk_idx=chunk_idx,
    )


def checkpoint_metadata(config: ConfigSchema, version: int) -> FileMetadata:
    return FileMetadata(config_json=config.to_json(), iteration=iteration_info(config, version))


# --------------------------------------------------------------------------- writing


def write_layout(root: Path, layout: LayoutContents) -> Path:
    """Write ``layout`` under ``root`` through pbgio's writers; return ``root/config.json``.

    The config's relative paths resolve against ``root``. The checkpoint directory is always
    created and holds ``config.json`` (and the committed version when there is a checkpoint).
    """
    root = Path(root)
    cfg = layout.config
    root.mkdir(parents=True, exist_ok=True)
    entity_path = root / cfg.entity_path
    entity_path.mkdir(parents=True, exist_ok=True)
    for (etype, part), count in layout.counts.items():
        entities.write_entity_count(entity_path, etype, part, count)
    for (etype, part), names in layout.names.items():
        entities.write_entity_names(entity_path, etype, part, names)
    if layout.dynamic_rel_count is not None:
        entities.write_dynamic_rel_count(entity_path, layout.dynamic_rel_count)
    if layout.relation_names is not None:
        entities.write_relation_names(entity_path, layout.relation_names)
    for edge_path in cfg.edge_paths:
        directory = root / edge_path
        directory.mkdir(parents=True, exist_ok=True)
        for (lhs, rhs), bucket in sorted(layout.buckets.get(edge_path, {}).items()):
            write_bucket(directory / naming.bucket_file(lhs, rhs), bucket)
    ckpt = CheckpointDir(root / cfg.checkpoint_path)
    if layout.checkpoint is not None:
        c = layout.checkpoint
        write_checkpoint(ckpt, c.version, embeddings=c.embeddings, model=c.model,
                         metadata=c.metadata, config=cfg, snapshot_epoch=c.snapshot_epoch)
        if c.stats:
            ckpt.append_stats(c.stats)
    else:
        ckpt.write_config(cfg)
    config_path = root / naming.CONFIG_JSON
    atomic.write_text(config_path, cfg.to_json())
    return config_path


# --------------------------------------------------------------------------- the rich layout


def _make_config(*, partitioned: bool, featurized: bool, dynamic: bool,
                 num_edge_paths: int) -> ConfigSchema:
    user_parts = 2 if partitioned else 1
    ents: dict[str, dict[str, Any]] = {
        "user": {"num_partitions": user_parts},
        # A relation joins types of one dimension (the comparator compares them): item's own
        # dimension differs from the global one only where item relates to item alone.
        "item": {"num_partitions": 1, "dimension": 4 if dynamic else 6},
    }
    if featurized:
        ents["doc"] = {"num_partitions": 1, "featurized": True, "dimension": 4 if dynamic else 6}
    rels: list[dict[str, Any]]
    if dynamic:
        rels = [{"name": "interacts", "lhs": "user", "rhs": "doc" if featurized else "item",
                 "operator": "affine"}]
    else:
        rels = [
            {"name": "follows", "lhs": "user", "rhs": "user", "operator": "translation"},
            {"name": "likes", "lhs": "item", "rhs": "item", "operator": "diagonal", "weight": 0.5},
        ]
        if featurized:
            rels.append({"name": "describes", "lhs": "doc", "rhs": "item", "operator": "affine"})
    edge_paths = ["edges"] + [f"edges_{i}" for i in range(1, num_edge_paths)]
    return parse_config({
        "entities": ents,
        "relations": rels,
        "dimension": 4,
        "global_emb": not dynamic,
        "dynamic_relations": dynamic,
        "entity_path": "entities",
        "edge_paths": edge_paths,
        "checkpoint_path": "checkpoint",
        "num_uniform_negs": 0 if featurized else 50,  # featurized types: same-batch negatives only
        "eval_num_uniform_negs": 0 if featurized else 1000,
        "num_epochs": 3,
        "num_edge_chunks": 2,
    })


def small_valid_layout(
    *,
    partitioned: bool = True,
    featurized: bool = True,
    dynamic: bool = False,
    weights: bool = True,
    names: bool = True,
    checkpoint: bool = True,
    snapshot: bool = False,
    num_edge_paths: int = 1,
    edges_per_bucket: int = 12,
    empty_bucket: bool = True,
    seed: int = 0,
) -> LayoutContents:
    """A deterministic valid layout, rich enough for every mutation.

    Static mode: ``user`` (2 partitions unless ``partitioned=False``, dimension 4), ``item`` (1
    partition, dimension 6) and, with ``featurized``, ``doc`` (featurized, 1 partition,
    dimension 6); relations ``follows`` (user→user, translation), ``likes`` (item→item,
    diagonal) and ``describes`` (doc→item, affine). Dynamic mode: every type has dimension 4;
    one relation ``interacts`` (user→doc, or user→item without ``featurized``, affine) with 3
    relation ids and no global embeddings.

    Bucket (1, 1) is empty with ``empty_bucket``; edges of unpartitioned types sit in
    partition 0 buckets. With ``checkpoint``, version 1 is committed (``snapshot`` adds an
    ``epoch_1/`` snapshot of it) and training_stats.json holds two lines.
    """
    rng = np.random.default_rng(seed)
    cfg = _make_config(partitioned=partitioned, featurized=featurized, dynamic=dynamic,
                       num_edge_paths=num_edge_paths)
    base_counts = {"user": [5, 4], "item": [7], "doc": [9]}
    counts = {(t, p): base_counts[t][p] for t, p in all_parts(cfg)}
    layout = LayoutContents(cfg, counts)
    if names:
        layout.names = {
            (t, p): [f"{t}-{p}-{i}" for i in range(c)]
            for (t, p), c in counts.items() if not cfg.entities[t].featurized
        }
    if dynamic:
        layout.dynamic_rel_count = 3
        if names:
            layout.relation_names = ["buys", "views", "rates"]
    elif names:
        layout.relation_names = [r.name for r in cfg.relations]
    for edge_path in cfg.edge_paths:
        layout.buckets[edge_path] = {
            key: (_empty_bucket(cfg, key, weights) if empty_bucket and key == (1, 1)
                  else _random_bucket(rng, layout, key, edges_per_bucket, weights))
            for key in grid(cfg)
        }
    if checkpoint:
        layout.checkpoint = _random_checkpoint(rng, layout, version=1,
                                               snapshot_epoch=1 if snapshot else None)
    return layout


def _bucket_sides_featurized(cfg: ConfigSchema, rel_ids: list[int]) -> tuple[bool, bool]:
    lhs = any(cfg.entities[relation_types(cfg, r)[0]].featurized for r in rel_ids)
    rhs = any(cfg.entities[relation_types(cfg, r)[1]].featurized for r in rel_ids)
    return lhs, rhs


def _empty_bucket(cfg: ConfigSchema, key: BucketKey, weights: bool) -> EdgeBucket:
    zero = np.zeros(0, np.int64)
    return EdgeBucket(zero, zero, zero, np.zeros(0, np.float32) if weights else None)


def _random_bucket(rng: np.random.Generator, layout: LayoutContents, key: BucketKey, n: int,
                   weights: bool) -> EdgeBucket:
    """Edges of every relation id that fits the bucket, cycling through them row by row."""
    cfg = layout.config
    fitting = []
    for rel_id in range(layout.num_relations):
        lhs_t, rhs_t = relation_types(cfg, rel_id)
        lp, rp = side_part(cfg, lhs_t, key[0]), side_part(cfg, rhs_t, key[1])
        if lp is None or rp is None:
            continue
        if not cfg.entities[lhs_t].featurized and layout.count(lhs_t, lp) == 0:
            continue
        if not cfg.entities[rhs_t].featurized and layout.count(rhs_t, rp) == 0:
            continue
        fitting.append(rel_id)
    if not fitting:
        return _empty_bucket(cfg, key, weights)
    # Runs of three: neighbouring rows share a relation (mutations rely on three featurized
    # rows in a row), and every fitting relation appears.
    rel = np.array([fitting[(i // 3) % len(fitting)] for i in range(n)], dtype=np.int64)
    sides: dict[str, np.ndarray[Any, np.dtype[np.int64]]] = {}
    bags: dict[str, list[list[int]]] = {}
    for s, side in enumerate(("lhs", "rhs")):
        idx = np.zeros(n, np.int64)
        side_bags: list[list[int]] = []
        for i, r in enumerate(rel):
            etype = relation_types(cfg, int(r))[s]
            part = side_part(cfg, etype, key[s])
            assert part is not None
            count = layout.count(etype, part)
            if cfg.entities[etype].featurized:
                idx[i] = -1  # ignored for featurized entities (the original's tests poison it)
                size = int(rng.integers(1, 4)) if count else 0
                side_bags.append(rng.integers(0, max(count, 1), size=size).tolist())
            else:
                idx[i] = rng.integers(0, count)
                side_bags.append([])
        sides[side] = idx
        bags[side] = side_bags
    lhs_feat, rhs_feat = _bucket_sides_featurized(cfg, fitting)
    return EdgeBucket(
        rel=rel,
        lhs=sides["lhs"],
        rhs=sides["rhs"],
        weight=rng.uniform(0.5, 2.0, size=n).astype(np.float32) if weights else None,
        lhs_features=FeatureLists.from_lists(bags["lhs"]) if lhs_feat else None,
        rhs_features=FeatureLists.from_lists(bags["rhs"]) if rhs_feat else None,
    )


def _random_checkpoint(rng: np.random.Generator, layout: LayoutContents, *, version: int,
                       snapshot_epoch: int | None) -> CheckpointContents:
    cfg = layout.config
    embeddings = {
        (t, p): EmbeddingsState(
            rng.standard_normal((layout.count(t, p), cfg.entity_dimension(t))).astype(np.float32),
            encode_row_adagrad(rng.uniform(0, 2, layout.count(t, p)).astype(np.float32), lr=cfg.lr),
        )
        for t, p in all_parts(cfg)
    }
    params = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in expected_params(cfg, layout.dynamic_rel_count).items()
    }
    sums = [rng.uniform(0, 2, value.shape).astype(np.float32) for value in params.values()]
    model = ModelState(params, encode_adagrad(sums, lr=cfg.relation_lr or cfg.lr, steps=3) if sums else None)
    stats = [
        {"lhs_partition": lhs, "rhs_partition": rhs, "index": i,
         "stats": {"count": len(layout.buckets[cfg.edge_paths[0]][(lhs, rhs)]),
                   "metrics": {"loss": 1.0 / (i + 1), "reg": 0.0}},
         "epoch_idx": 0, "edge_path_idx": 0, "edge_chunk_idx": 0}
        for i, (lhs, rhs) in enumerate(grid(cfg)[:2])
    ]
    return CheckpointContents(version, embeddings, model, checkpoint_metadata(cfg, version),
                            snapshot_epoch=snapshot_epoch, stats=stats)


def layout_summary(layout: LayoutContents) -> str:
    """A one-line description, handy in test failure messages."""
    cfg = layout.config
    return json.dumps({
        "entities": {t: [e.num_partitions, e.featurized] for t, e in cfg.entities.items()},
        "relations": [[r.lhs, r.rhs, r.operator] for r in cfg.relations],
        "dynamic": cfg.dynamic_relations,
        "buckets": {p: {f"{k[0]}_{k[1]}": len(b) for k, b in bs.items()}
                    for p, bs in layout.buckets.items()},
        "checkpoint": None if layout.checkpoint is None else layout.checkpoint.version,
    }, ensure_ascii=False)
