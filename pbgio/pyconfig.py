"""Compatibility alias, the name of :mod:`pbgio.python_config` before an earlier release: the documented
``from pbgio.pyconfig import config_from_python, load_python_config`` keeps working."""

from pbgio.layout import config_from_python, load_python_config

__all__ = ["config_from_python", "load_python_config"]
