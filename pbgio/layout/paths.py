"""Where a config lives and what its relative paths mean: the rules every command shares.

- :func:`find_config`: the ``config.json`` of a checkpoint or project directory.
- :func:`infer_base`: the folder a config's relative paths resolve against: the config file's
  folder, or, for the ``config.json`` inside a checkpoint directory, the folder that holds
  ``checkpoint_path`` (so a checkpoint's own config names the layout it was trained on).
- :func:`is_here`: whether a path given on the command line says "relative to the current
  directory" (``./…``, ``../…``); every other relative path on a command line is relative to the
  config's folder, like the config's own paths (:meth:`pbgio.layout.Layout.argument_path`).

>>> from pathlib import Path
>>> str(infer_base(Path("/runs/fb/config.json"), "model"))
'/runs/fb'
>>> str(infer_base(Path("/runs/fb/model/best/config.json"), "model/best"))
'/runs/fb'
"""

from __future__ import annotations

from pbgio import storage
from pbgio.spec import naming
from pbgio.storage import AnyPath


def find_config(path: AnyPath) -> AnyPath | None:
    """The config.json of a checkpoint or project directory (itself or one level down; None when
    there is none, or more than one one level down)."""
    direct = path / naming.CONFIG_JSON
    if direct.is_file():
        return direct
    below = [p / naming.CONFIG_JSON for p in storage.children(path) if (p / naming.CONFIG_JSON).is_file()]
    return below[0] if len(below) == 1 else None


def infer_base(config_path: AnyPath, checkpoint_path: str) -> AnyPath:
    """The folder the relative paths of the config at ``config_path`` resolve against, given its
    ``checkpoint_path`` (see the module doc)."""
    directory: AnyPath = storage.absolute(config_path).parent
    if storage.scheme_of(checkpoint_path) not in (None, *storage.LOCAL_SCHEMES):
        return directory  # a URL: resolved (and contacted) only where the command may
    checkpoint = storage.resolve(checkpoint_path)
    if config_path.name == naming.CONFIG_JSON and not storage.is_remote(checkpoint) \
            and not checkpoint.is_absolute():
        parts = checkpoint.parts
        if parts and tuple(directory.parts[-len(parts):]) == parts:
            for _ in parts:
                directory = directory.parent
    return directory


def is_here(text: str) -> bool:
    """Whether a command-line path says "relative to the current directory" (``./…``, ``../…``).

    >>> [is_here(t) for t in ("./a", "../a", ".", "a/b", "/a", "s3://b/a")]
    [True, True, True, False, False, False]
    """
    return text in (".", "..") or text.startswith(("./", "../", ".\\", "..\\"))
