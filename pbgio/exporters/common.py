"""What every export needs: the checkpoint version to read, safe output files, a report.

The config is a :class:`pbgio.layout.Layout` (or a file or schema it is loaded from), and
the version is read as what it is (:func:`pbgio.layout.open_checkpoint`: a ``--checkpoint``
relative to the config's folder, the stored model's own settings). The version is the
committed one unless given.
Outputs are written atomically (temp file, fsync, rename) and never replace an
existing file unless asked to.

>>> report = ExportReport(version=3, seconds=0.5)
>>> report.rows["user"] = 10
>>> print(report.summary())
exported checkpoint version 3: user 10 rows in 0.50 s
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

from pbgio.checkpoint import CheckpointDir, read_committed
from pbgio.errors import PbgioError
from pbgio.layout import Layout
from pbgio.storage import atomic


class ExportError(PbgioError, ValueError):
    """The checkpoint and entity files cannot make the export asked for."""


class OutputExistsError(PbgioError, FileExistsError):
    """An output file exists and overwriting was not asked for."""


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


P = ParamSpec("P")
T = TypeVar("T")


def consistent_version(export: Callable[P, T]) -> Callable[P, T]:
    """Run an export (``config`` first, keyword ``version``, ``base``, ``checkpoint``) on one complete
    version while ``pbgtrain fit`` may be committing: without ``version``, the committed one, and
    when a commit removes one of its files meanwhile, the export starts over on the new committed
    version (:func:`pbgio.checkpoint.read_committed`). Its outputs appear together when it succeeds
    (:func:`pbgio.storage.atomic.together`): a failed or restarted attempt leaves none behind."""

    @functools.wraps(export)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        with atomic.together():
            if kwargs.get("version") is not None:
                return export(*args, **kwargs)
            config = args[0] if args else kwargs["config"]
            layout = Layout.of(cast(Any, config), base=cast(Any, kwargs.get("base")))
            checkpoint = CheckpointDir(layout.with_checkpoint(cast(Any, kwargs.get("checkpoint"))).checkpoint_path)
            return cast(T, read_committed(
                checkpoint, lambda version: cast(Any, export)(*args, **{**kwargs, "version": version})))

    return run


def check_free(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{path}: exists; pass --overwrite (overwrite=True) to replace it")


@contextlib.contextmanager
def output_file(path: Path, overwrite: bool) -> Iterator[Path]:
    """A temp path to write ``path`` through; moved into place (fsynced) when the block succeeds (or,
    inside :func:`pbgio.storage.atomic.together`, when the whole export does)."""
    check_free(path, overwrite)
    with atomic.write_failures(path):
        atomic.make_dirs(path.parent)
    with atomic.atomic_target(path) as tmp:
        yield tmp
