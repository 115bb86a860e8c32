"""A config and where its paths point, as every command takes it: :class:`Layout`.

- :mod:`pbgio.layout.layout`: :class:`Layout` (a config after ``-p`` overrides, the folder its
  relative paths resolve against, where it came from; the one path rule of the command lines)
  and :class:`CheckpointVersion` (a checkpoint version read as what it is);
- :mod:`pbgio.layout.overrides`: the ``-p key.path=value`` overrides, applied as the original
  applies them, and the original's Python configs loaded with them;
- :mod:`pbgio.layout.paths`: where a config lives (:func:`find_config`) and the folder its
  relative paths resolve against (:func:`infer_base`).
"""

from pbgio.layout.layout import IN_MEMORY, CheckpointVersion, Layout, open_checkpoint, stored_config
from pbgio.layout.overrides import config_from_python, load_python_config, override_config_dict
from pbgio.layout.paths import find_config, infer_base, is_here

__all__ = [
    "IN_MEMORY",
    "CheckpointVersion",
    "Layout",
    "config_from_python",
    "find_config",
    "infer_base",
    "is_here",
    "load_python_config",
    "open_checkpoint",
    "override_config_dict",
    "stored_config",
]
