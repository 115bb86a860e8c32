"""Deprecated: :mod:`pbgtrain.early_stopping` before it was renamed (beside :mod:`pbgio.validate`, the
format's checks, "validation" misled). Importing it gives the new module, with a warning, for one
release."""

from pbgio.deprecation import renamed_module

renamed_module(__name__, "pbgtrain.early_stopping")
