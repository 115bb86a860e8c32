"""Where a path stored in a legacy config lies under SRC today.

A legacy METADATA file stores the run's paths (``checkpoint_path``, ``entity_path``,
``edge_paths``, ``init_path``) as the run saw them, often absolute and on another machine.
:class:`PathResolver` finds them under SRC from the one path it can anchor: the checkpoint
directory the METADATA was found in.

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> for d in ("run/checkpoint", "run/data/entities"):
...     (root / d).mkdir(parents=True)
>>> resolver = PathResolver(root, "/home/someone/run/checkpoint", root / "run" / "checkpoint")
>>> resolver.resolve("/home/someone/run/data/entities") == root / "run" / "data" / "entities"
True
>>> resolver.resolve("/elsewhere/data") is None
True
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

__all__ = ["PathResolver"]


class PathResolver:
    """Maps a path stored in the legacy config to a directory under SRC.

    The stored ``checkpoint_path`` and the directory its METADATA was found in
    share a tail; what precedes the tail is the run's working directory, then and now.
    :meth:`resolve` gives ``None`` for a path outside SRC or one that is not a directory.
    """

    def __init__(self, root: Path, stored_checkpoint: str, found_checkpoint: Path) -> None:
        self.root = root
        stored = PurePosixPath(stored_checkpoint)
        parts = [p for p in stored.parts if p != "."]
        found = found_checkpoint.relative_to(root).parts
        k = 0
        while k < min(len(parts), len(found)) and parts[-1 - k] == found[-1 - k]:
            k += 1
        self.old_cwd: PurePosixPath | None
        if stored.is_absolute():
            self.old_cwd = PurePosixPath(*parts[: len(parts) - k]) if k else None
            self.new_cwd = Path(root, *found[: len(found) - k]) if k else root
        else:
            self.old_cwd = PurePosixPath()
            self.new_cwd = Path(root, *found[: len(found) - k]) if k == len(parts) else root

    def resolve(self, stored: str) -> Path | None:
        path = PurePosixPath(stored)
        if path.is_absolute():
            if self.old_cwd is None or not self.old_cwd.is_absolute():
                return None
            try:
                relative = path.relative_to(self.old_cwd)
            except ValueError:
                return None
            candidate = self.new_cwd / relative
        else:
            candidate = self.new_cwd / path
        try:
            candidate.resolve().relative_to(self.root.resolve())
        except ValueError:
            return None
        return candidate if candidate.is_dir() else None
