"""The actions of migration steps: each writes one file of DST under the staging directory.

An action (:data:`~pbgio.legacy.plan.Action`) takes the staging root and a callback that is
told how many bytes of legacy input are done. The ``write_*`` and :func:`empty_bucket`
factories return an action for a value the planner already read (counts, names, config text);
the ``convert_*`` functions read and convert a large legacy file when the step runs, and are
bound to their file with :func:`functools.partial`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pbgio.checkpoint import CheckpointDir, EmbeddingsState, FileMetadata, ModelState
from pbgio.config import ConfigSchema
from pbgio.edges import BucketWriter
from pbgio.legacy.plan import Action, Advance
from pbgio.legacy.reader import LegacyCheckpointDir, LegacyEdgeDir
from pbgio.legacy.state import MigratedModel, serialize
from pbgio.spec.edges import WRITE_CHUNK_ELEMENTS
from pbgio.storage import atomic

__all__ = ["convert_bucket", "convert_embeddings", "convert_model", "empty_bucket", "write_dir",
           "write_entity", "write_text"]


def write_text(target: str, text: str) -> Action:
    """Write ``text`` to ``target`` (a path under the staging root), atomically."""
    def run(staging: Path, advance: Advance) -> None:
        path = staging / target
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, text)
    return run


def write_entity(writer: Callable[[Path, str, int, Any], None], directory: str, etype: str, part: int,
                 value: Any) -> Action:
    """Write one entity type's partition file (a count or names) with ``writer``."""
    def run(staging: Path, advance: Advance) -> None:
        writer(staging / directory, etype, part, value)
        advance(0)
    return run


def write_dir(writer: Callable[[Path, Any], None], directory: str, value: Any) -> Action:
    """Write one file of an entity directory (relation names or count) with ``writer``."""
    def run(staging: Path, advance: Advance) -> None:
        writer(staging / directory, value)
    return run


def empty_bucket(target: str) -> Action:
    """Write an empty bucket (one the legacy layout lacks but today's grid needs)."""
    def run(staging: Path, advance: Advance) -> None:
        BucketWriter(staging / target).close()
    return run


def convert_bucket(edge_dir: LegacyEdgeDir, lhs: int, rhs: int, target: str, size: int, staging: Path,
                   advance: Advance) -> None:
    """Copy a legacy bucket block by block, 0-based, into a current one; ``size`` is its bytes on disk."""
    n = max(1, edge_dir.bucket_length(lhs, rhs))
    done = 0
    with BucketWriter(staging / target, buffer_edges=WRITE_CHUNK_ELEMENTS) as writer:
        for start, end, block in edge_dir.iter_blocks(lhs, rhs):
            writer.append(block)
            step = size * end // n - done if end < n else size - done
            done += step
            advance(step)
            del start


def convert_embeddings(checkpoint: LegacyCheckpointDir, etype: str, part: int, version: int, dst: str,
                       metadata: FileMetadata, staging: Path, advance: Advance) -> None:
    """Convert one partition's embeddings (and its RowAdagrad state) into checkpoint ``dst``."""
    state: EmbeddingsState = checkpoint.read_embeddings(etype, part, version)
    CheckpointDir(staging / dst).write_embeddings(etype, part, version, state, metadata)
    advance(checkpoint.embeddings_of_version(version)[(etype, part)].stat().st_size)


def convert_model(checkpoint: LegacyCheckpointDir, version: int, config: ConfigSchema | None,
                  model: MigratedModel | None, dst: str, metadata: FileMetadata, staging: Path,
                  advance: Advance) -> None:
    """Write the model of ``version`` into checkpoint ``dst``: ``model`` if the planner already
    migrated it, else migrated from the version's METADATA now."""
    migrated = model if model is not None else checkpoint.migrate_model(version, config)
    state = ModelState(migrated.params, None if migrated.optimizer is None else serialize(migrated.optimizer))
    CheckpointDir(staging / dst).write_model(version, state, metadata)
    path = checkpoint.metadata_path(version)
    advance(path.stat().st_size if path is not None else 0)
