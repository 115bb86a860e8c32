"""pbgio: the PyTorch-BigGraph format SDK.

Read, write and validate every on-disk artifact of a PBG layout::

    >>> import pbgio
    >>> sorted(pbgio.__all__)[:4]
    ['BucketWriter', 'CheckpointDir', 'ConfigError', 'ConfigSchema']

The submodules are the API: :mod:`pbgio.config` (run config), :mod:`pbgio.entities`,
:mod:`pbgio.edges`, :mod:`pbgio.checkpoint` (readers and writers),
:mod:`pbgio.validate` (the validator), :mod:`pbgio.spec` (the format declaration),
:mod:`pbgio.checks` (the code of every rule, shared by readers and validator)
and :mod:`pbgio.testing` (hypothesis strategies and mutators for your own tests).
Names are re-exported here lazily, so ``import pbgio`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pbgio.lazy import lazy_exports

if TYPE_CHECKING:
    from pbgio.checkpoint import (
        CheckpointDir,
        EmbeddingsState,
        FileMetadata,
        IterationInfo,
        ModelState,
        plan_checkpoint,
        write_checkpoint,
    )
    from pbgio.config import ConfigSchema, load_config, parse_config
    from pbgio.edges import BucketWriter, EdgeBucket, FeatureLists, bucket_length, read_bucket, write_bucket
    from pbgio.entities import (
        read_dynamic_rel_count,
        read_entity_count,
        read_entity_names,
        read_relation_names,
        write_dynamic_rel_count,
        write_entity_count,
        write_entity_names,
        write_relation_names,
    )
    from pbgio.errors import (
        ConfigError,
        CorruptFileError,
        FormatError,
        Issue,
        MissingArtifactError,
        PbgioError,
        Report,
        UnknownNameError,
        UnsafePickleError,
        VersionError,
    )
    from pbgio.validate import validate_path

__all__, _export = lazy_exports("pbgio", {
    "pbgio.checkpoint": ["CheckpointDir", "EmbeddingsState", "FileMetadata", "IterationInfo", "ModelState",
                         "plan_checkpoint", "write_checkpoint"],
    "pbgio.config": ["ConfigSchema", "load_config", "parse_config"],
    "pbgio.edges": ["BucketWriter", "EdgeBucket", "FeatureLists", "bucket_length", "read_bucket",
                    "write_bucket"],
    "pbgio.entities": ["read_dynamic_rel_count", "read_entity_count", "read_entity_names",
                       "read_relation_names", "write_dynamic_rel_count", "write_entity_count",
                       "write_entity_names", "write_relation_names"],
    "pbgio.errors": ["ConfigError", "CorruptFileError", "FormatError", "Issue", "MissingArtifactError",
                     "PbgioError", "Report", "UnknownNameError", "UnsafePickleError", "VersionError"],
    "pbgio.validate": ["validate_path"],
})


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("pbg")
    return _export(name)
