"""pbgio: the PyTorch-BigGraph format SDK.

Read, write and validate every on-disk artifact of a PBG layout::

    >>> import pbgio
    >>> sorted(pbgio.__all__)[:4]
    ['BucketWriter', 'CheckpointDir', 'CheckpointVersion', 'ConfigError']

The public API (what tools built on pbgio, pbgtrain among them, may import):

- :mod:`pbgio.layout`: the :class:`~pbgio.layout.Layout` every command takes (a config after
  ``-p`` overrides and the folder its paths resolve against) and checkpoint versions read as what
  they are (:class:`~pbgio.layout.CheckpointVersion`);
- the artifacts: :mod:`pbgio.config` (run config; :mod:`pbgio.python_config` runs the original's
  Python configs), :mod:`pbgio.entities`, :mod:`pbgio.edges`, :mod:`pbgio.checkpoint`,
  :mod:`pbgio.optimizer_state`, :mod:`pbgio.names` (entities by name), :mod:`pbgio.topk`,
  :mod:`pbgio.candidates` (which entities a search may return, by name);
- :mod:`pbgio.validate` (the validator), :mod:`pbgio.spec` (the format declaration),
  :mod:`pbgio.checks` (the predicate of every rule, over data already read: a tool that refuses
  something for a catalogue rule, as pbgtrain does, calls it instead of coding the rule again),
  :mod:`pbgio.errors` (the error tree);
- :mod:`pbgio.storage` (paths, URLs, atomic writes; the package itself, not its modules),
  :mod:`pbgio.interrupts` and :mod:`pbgio.progress` (Ctrl-C and progress bars for long work),
  :mod:`pbgio.console`, :mod:`pbgio.options` and :mod:`pbgio.fields` (exit codes and messages,
  the shared options, the splitting of delimited lines: what every pbg command line shares);
- the tools: :mod:`pbgio.importers`, :mod:`pbgio.exporters`, :mod:`pbgio.legacy`,
  :mod:`pbgio.neighbors`, :mod:`pbgio.index`, :mod:`pbgio.info`, :mod:`pbgio.example`;
- :mod:`pbgio.testing` (hypothesis strategies and mutators for your own tests).

Internal: :mod:`pbgio.formats` (HDF5 and torch payloads at the byte level), the modules inside
:mod:`pbgio.storage`, and the commands of :mod:`pbgio.cli`. The layers are declared in
``pyproject.toml`` and checked by import-linter (docs/architecture.md). Names are re-exported
here lazily, so ``import pbgio`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pbgio.deprecation import renamed_names
from pbgio.lazy import lazy_exports

if TYPE_CHECKING:
    from pbgio.checkpoint import (
        CheckpointDir,
        EmbeddingsState,
        FileMetadata,
        IterationInfo,
        ModelState,
        commit_steps,
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
        UsageError,
        VersionError,
    )
    from pbgio.index import open_index as open_index
    from pbgio.layout import CheckpointVersion as CheckpointVersion
    from pbgio.layout import Layout as Layout
    from pbgio.layout import open_checkpoint as open_checkpoint
    from pbgio.validate import validate_layout as validate_layout
    from pbgio.validate import validate_path

__all__, _export = lazy_exports("pbgio", {
    "pbgio.checkpoint": ["CheckpointDir", "EmbeddingsState", "FileMetadata", "IterationInfo", "ModelState",
                         "commit_steps", "write_checkpoint"],
    "pbgio.config": ["ConfigSchema", "load_config", "parse_config"],
    "pbgio.edges": ["BucketWriter", "EdgeBucket", "FeatureLists", "bucket_length", "read_bucket",
                    "write_bucket"],
    "pbgio.entities": ["read_dynamic_rel_count", "read_entity_count", "read_entity_names",
                       "read_relation_names", "write_dynamic_rel_count", "write_entity_count",
                       "write_entity_names", "write_relation_names"],
    "pbgio.errors": ["ConfigError", "CorruptFileError", "FormatError", "Issue", "MissingArtifactError",
                     "PbgioError", "Report", "UnknownNameError", "UnsafePickleError", "UsageError",
                     "VersionError"],
    "pbgio.index": ["open_index"],
    "pbgio.layout": ["CheckpointVersion", "Layout", "open_checkpoint"],
    "pbgio.validate": ["validate_layout", "validate_path"],
})


def _exported(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("pbg")
    return _export(name)


__getattr__ = renamed_names("pbgio", {"plan_checkpoint": "commit_steps"}, fallback=_exported)
