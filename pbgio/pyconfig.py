"""Deprecated: the name of :mod:`pbgio.python_config`'s loaders before an earlier release. The
documented ``from pbgio.pyconfig import config_from_python, load_python_config`` keeps working for
one more release, with a warning; import them from :mod:`pbgio.layout`."""

from pbgio.deprecation import renamed_module

renamed_module(__name__, "pbgio.layout")
