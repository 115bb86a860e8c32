"""Deprecated: :mod:`pbgtrain.schedule` before it was renamed ("plan" named other things too). Importing
``pbgtrain.plan``, ``pbgtrain.plan.batching`` or ``pbgtrain.plan.buckets`` gives the new modules, with a
warning, for one release."""

from pbgio.deprecation import renamed_module

renamed_module(__name__, "pbgtrain.schedule", submodules=("batching", "buckets"))
