"""A committed version kept for good: ``best/`` (what ``pbgtrain fit --valid`` keeps), a checkpoint
directory of its own that later commits never remove."""

from __future__ import annotations

import os

from pbgio import confinement, storage
from pbgio.checkpoint import CheckpointDir
from pbgio.spec import naming
from pbgio.spec.entities import format_count
from pbgio.storage import AnyPath, atomic


def keep_version(ckpt: CheckpointDir, version: int, name: str = naming.BEST_DIR) -> AnyPath:
    """Keep committed ``version`` in the subdirectory ``name`` (default ``best/``) for good: a
    checkpoint directory of its own (its files, ``config.json`` and a version file) that later
    commits, pbgtrain's or the original's, never remove. Returns the subdirectory.

    Local files are hard links (no copy; the data stays while either name does), copies where a
    link cannot be made and on object stores. Like a commit: the files first, then the version
    file (written atomically: the switch), then the files of the version kept before.

    >>> import tempfile, pathlib
    >>> import numpy as np
    >>> from pbgio.checkpoint import EmbeddingsState, write_checkpoint
    >>> from pbgio.example import example_config
    >>> d = CheckpointDir(pathlib.Path(tempfile.mkdtemp()))
    >>> state = EmbeddingsState(np.ones((2, 4), dtype=np.float32))
    >>> for v in (1, 2):
    ...     write_checkpoint(d, v, embeddings={("user", 0): state}, model=None)
    >>> best = keep_version(d, 1)
    Traceback (most recent call last):
    ...
    ValueError: version 1 has no files left in ...; keep a version right after it is committed
    >>> best = keep_version(d, 2)
    >>> write_checkpoint(d, 3, embeddings={("user", 0): state}, model=None)
    >>> CheckpointDir(best).read_version(), sorted(p.name for p in best.iterdir())
    (2, ['checkpoint_version.txt', 'embeddings_user_0.v2.h5'])
    """
    files = ckpt.files_of_version(version)
    if not files:
        raise ValueError(f"version {version} has no files left in {storage.display(ckpt.path)}; "
                         "keep a version right after it is committed")
    kept = ckpt.path / name
    atomic.real_dir(kept, f"kept version's directory {name}/")  # a link there would receive (and lose) files
    config = ckpt.path / naming.CONFIG_JSON
    for path in [*files, *([config] if config.is_file() else [])]:
        _link_or_copy(path, kept / path.name)
    atomic.write_text(kept / naming.CHECKPOINT_VERSION, format_count(version))
    for stale in CheckpointDir(kept).versions_on_disk():
        if stale != version:
            for path in CheckpointDir(kept).files_of_version(stale):
                atomic.remove_file(path, "file of the version kept before")
    return kept


def _link_or_copy(source: AnyPath, target: AnyPath) -> None:
    """``target`` holds ``source``'s bytes: a hard link where possible (replacing what was there)."""
    if not storage.is_remote(source) and not storage.is_remote(target):
        confinement.check_write(target, "kept version's file")
        try:
            if target.exists() and os.path.samefile(source, target):
                return
            staged = target.with_name(target.name + ".link-tmp")
            staged.unlink(missing_ok=True)
            os.link(source, staged, follow_symlinks=False)  # a link a layout shipped stays a link
            os.replace(staged, target)
            return
        except OSError:  # another file system, or one without hard links: copy
            pass
    storage.copy_file(source, target)
