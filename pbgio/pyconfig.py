"""Compatibility alias of :mod:`pbgio.python_config`, its name before this release: the documented
``from pbgio.pyconfig import config_from_python, load_python_config`` keeps working."""

from pbgio.python_config import config_from_python, load_python_config

__all__ = ["config_from_python", "load_python_config"]
