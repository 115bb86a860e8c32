"""Lazy package exports: a name is imported from its module on first use (PEP 562).

Packages list their public names by module so that ``import pbgio`` (or a CLI that needs one
function) does not import h5py, polars or numpy up front.

>>> all_names, getattr_ = lazy_exports("pbgio", {"pbgio.errors": ["PbgioError"]})
>>> all_names, getattr_("PbgioError").__name__
(['PbgioError'], 'PbgioError')
>>> getattr_("nope")
Traceback (most recent call last):
...
AttributeError: module 'pbgio' has no attribute 'nope'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for ``package`` exporting ``exports`` (module → names)."""
    where = {name: module for module, names in exports.items() for name in names}

    def module_getattr(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return sorted(where), module_getattr
