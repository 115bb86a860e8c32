"""``pbgio info``: a summary of a layout (types, partitions, counts, buckets, versions).

>>> from pbgio.example import build_example
>>> import tempfile, pathlib
>>> config = build_example(pathlib.Path(tempfile.mkdtemp()), num_edges=500)
>>> summary = summarize(config)
>>> summary["entities"]["user"]["counts"], summary["edge_paths"][0]["total_edges"]
([30, 30], 500)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pbgio import storage, training_memory
from pbgio.checkpoint import CheckpointDir
from pbgio.checks.files import UNREADABLE_BY_DESIGN
from pbgio.edges import bucket_length, iter_buckets
from pbgio.entities import read_dynamic_rel_count, read_entity_count, read_relation_names
from pbgio.errors import FormatError, MissingArtifactError, PbgioError
from pbgio.layout import Layout, find_config
from pbgio.spec import naming
from pbgio.storage import AnyPath


def summarize(location: AnyPath | str, *, base: AnyPath | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """A JSON-able summary of a config's layout (its ``overrides`` applied), or of a single artifact
    directory (a path or URL)."""
    path = storage.resolve(location)
    with storage.remote_errors(path, "path to summarize"):
        if not path.exists():
            raise MissingArtifactError(storage.display(path), "path to summarize", found=storage.link_problem(path))
    config_path = path if path.is_file() else find_config(path)
    if config_path is None:
        return _summarize_dir(path)
    return _summarize_config(Layout.load(config_path, base=base, overrides=overrides))


COUNTS_LISTED_MISSING = 5
"""Partitions without a count file that a type's ``counts`` lists beyond as many as have one: a
config's ``num_partitions`` (10**7 …) is compared with the files found, never walked; the rest is a
number, ``count_files_missing``."""

def _safe(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except FormatError as exc:
        if exc.issue.rule in UNREADABLE_BY_DESIGN:  # refused, the file named (docs/security.md)
            raise
        return None
    except (PbgioError, OSError):
        return None


def _count_files(entity_path: AnyPath) -> dict[str, set[int]]:
    """The partitions of each type that have a count file in ``entity_path``, from one listing."""
    found: dict[str, set[int]] = {}
    for file in _safe(storage.children, entity_path) or []:
        parsed = naming.parse_entity_count_file(file.name)
        if parsed:
            found.setdefault(parsed[0], set()).add(parsed[1])
    return found


def _entity_summary(layout: Layout, name: str, found: set[int]) -> dict[str, Any]:
    """A type's summary: its counts by partition, the first partitions only when most count files
    are missing (``count_files_missing`` says how many)."""
    cfg, entity_path = layout.config, layout.entity_path
    partitions = cfg.entities[name].num_partitions
    listed = min(partitions, len(found) + COUNTS_LISTED_MISSING)
    summary: dict[str, Any] = {
        "num_partitions": partitions, "featurized": cfg.entities[name].featurized,
        "dimension": cfg.entity_dimension(name),
        "counts": [_safe(read_entity_count, entity_path, name, p) if p in found else None for p in range(listed)]}
    if listed < partitions:
        summary["count_files_missing"] = partitions - sum(1 for p in found if p < partitions)
    return summary


def _summarize_config(layout: Layout) -> dict[str, Any]:
    cfg, entity_path = layout.config, layout.entity_path
    found = _count_files(entity_path)
    summary: dict[str, Any] = {
        "config": layout.source,
        "dimension": cfg.dimension,
        "dynamic_relations": cfg.dynamic_relations,
        "entities": {name: _entity_summary(layout, name, found.get(name, set())) for name in cfg.entities},
        "relations": [{"name": r.name, "lhs": r.lhs, "rhs": r.rhs, "operator": r.operator}
                      for r in cfg.relations],
    }
    if cfg.dynamic_relations:
        summary["dynamic_rel_count"] = _safe(read_dynamic_rel_count, entity_path)
        summary["dynamic_rel_names"] = _safe(read_relation_names, entity_path)
    summary["edge_paths"] = [_summarize_edges(p) for p in layout.edge_paths]
    summary["checkpoint"] = _summarize_checkpoint(layout.checkpoint_path)
    summary["training_memory"] = _safe(training_memory.summary, layout)
    return summary


def _summarize_edges(edge_path: AnyPath) -> dict[str, Any]:
    buckets = {}
    if edge_path.is_dir():
        for lhs, rhs, file in iter_buckets(edge_path):
            buckets[f"{lhs}_{rhs}"] = _safe(bucket_length, file)
    return {"path": storage.display(edge_path), "buckets": buckets,
            "total_edges": sum(n for n in buckets.values() if n is not None)}


def _summarize_checkpoint(path: AnyPath) -> dict[str, Any]:
    ckpt = CheckpointDir(path)
    best = path / naming.BEST_DIR  # pbgtrain fit --valid keeps the version that scored best there
    return {"path": storage.display(path), "exists": path.is_dir(), "version": _safe(ckpt.read_version),
            "versions_on_disk": ckpt.versions_on_disk(),
            "snapshots": sorted(p.name for p in path.glob("epoch_*")) if path.is_dir() else [],
            "best_version": _safe(CheckpointDir(best).read_version) if best.is_dir() else None,
            "indexes": sorted(p.name for p in path.iterdir() if naming.parse_index_file(p.name)) if path.is_dir()
            else []}


def _summarize_dir(path: AnyPath) -> dict[str, Any]:
    counts = {}
    for file in storage.glob(path, "entity_count_*.txt"):
        parsed = naming.parse_entity_count_file(file.name)
        if parsed:
            counts[f"{parsed[0]}/{parsed[1]}"] = _safe(read_entity_count, path, *parsed)
    return {"path": storage.display(path), "entity_counts": counts, "edges": _summarize_edges(path),
            "checkpoint": _summarize_checkpoint(path)}
