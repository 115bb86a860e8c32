"""What every export needs: the checkpoint version to read, safe output files, a report.

Relative config paths resolve like ``pbgio validate`` resolves them (against the
config file's directory, or the directory holding ``checkpoint_path`` for a
checkpoint's own ``config.json``). The version is the committed one unless given.
Outputs are written atomically (temp file, fsync, rename) and never replace an
existing file unless asked to.

>>> report = ExportReport(version=3, seconds=0.5)
>>> report.rows["user"] = 10
>>> print(report.summary())
exported checkpoint version 3: user 10 rows in 0.50 s
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pbgio import atomic, storage
from pbgio.checkpoint import CheckpointDir
from pbgio.config import ConfigSchema, load_config
from pbgio.errors import PbgioError
from pbgio.storage import AnyPath


class ExportError(PbgioError, ValueError):
    """The checkpoint and entity files cannot make the export asked for."""


class OutputExistsError(PbgioError, FileExistsError):
    """An output file exists and overwriting was not asked for."""


@dataclass(frozen=True)
class ExportSource:
    config: ConfigSchema
    entity_path: AnyPath
    checkpoint: CheckpointDir
    version: int


def open_export_source(config: ConfigSchema | str | AnyPath, *, base: str | AnyPath | None = None,
                       checkpoint: str | AnyPath | None = None, version: int | None = None) -> ExportSource:
    """The config, its entity directory, the checkpoint directory and the version to export."""
    base = None if base is None else storage.resolve(base)
    if isinstance(config, ConfigSchema):
        cfg = config
        base = base if base is not None else Path.cwd()
    else:
        from pbgio.validate import infer_base

        cfg = load_config(config)
        base = base if base is not None else infer_base(storage.resolve(config), cfg)
    ckpt = CheckpointDir(checkpoint if checkpoint is not None else storage.resolve(cfg.checkpoint_path, base))
    with storage.remote_errors(ckpt.path, "checkpoint directory"):
        found = ckpt.path.is_dir()
    if not found:
        raise ExportError(f"{storage.display(ckpt.path)}: expected a checkpoint directory, found none "
                          "(train first, or pass --checkpoint)")
    chosen = ckpt.read_version() if version is None else version
    return ExportSource(cfg, storage.resolve(cfg.entity_path, base), ckpt, chosen)


@dataclass
class ExportReport:
    version: int
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)  # entity type (or "relations") -> rows written
    global_added: list[str] = field(default_factory=list)  # types whose global embedding was added

    def summary(self) -> str:
        rows = ", ".join(f"{name} {n:,} rows" for name, n in self.rows.items()) or "nothing"
        added = f"; global embeddings added to {', '.join(self.global_added)}" if self.global_added else ""
        return f"exported checkpoint version {self.version}: {rows}{added} in {self.seconds:.2f} s"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_free(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{path}: exists; pass --overwrite (overwrite=True) to replace it")


@contextlib.contextmanager
def output_file(path: Path, overwrite: bool) -> Iterator[Path]:
    """A temp path to write ``path`` through; moved into place (fsynced) when the block succeeds."""
    check_free(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_target(path) as tmp:
        yield tmp
