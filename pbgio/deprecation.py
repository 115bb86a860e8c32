"""Old names kept for one release after a rename, each with a ``DeprecationWarning`` naming the new one.

A renamed module keeps a file at its old path that calls :func:`renamed_module`: importing it gives
the new module itself (one module object, so classes stay identical) and warns. A renamed class or
function stays importable from its module through :func:`renamed_names`, the module's PEP 562
``__getattr__``. The warning points at the user's import line, so Python's default filters show
it in a script.

>>> import warnings
>>> getattr_ = renamed_names("pbgio.errors", {"OldError": "PbgioError"})
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     getattr_("OldError").__name__
'PbgioError'
>>> str(caught[0].message)
'pbgio.errors.OldError is now pbgio.errors.PbgioError; the old name will be removed in the next release'
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

REMOVAL = "the old name will be removed in the next release"


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside this module and the files left at old module
    paths (``warnings.warn`` skips the import machinery's frames itself)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or frame.f_globals.get("__name__") in _ALIASES):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


_ALIASES: set[str] = set()
"""Modules that are only an old name (their frames are skipped when a warning is placed)."""


def warn_renamed(old: str, new: str, *, callers_to_skip: int = 0) -> None:
    """Warn that ``old`` (a dotted name) is now ``new``. The warning names the line of the caller
    (a module's ``__getattr__`` here, or a file left at an old path: the user's import line), or,
    for a caller that only passes the old name on (``__post_init__``), ``callers_to_skip`` frames
    above it."""
    warnings.warn(f"{old} is now {new}; {REMOVAL}", DeprecationWarning,
                  stacklevel=_user_stacklevel() + callers_to_skip)


def renamed_module(old: str, new: str, submodules: Iterable[str] = ()) -> None:
    """Called by the file left at a renamed module's old path: the import of ``old`` gives module
    ``new`` (the same object), with a warning. A renamed package names its ``submodules``, so that
    ``old.sub`` is ``new.sub`` too (not a second copy of it, whose classes would differ)."""
    _ALIASES.add(old)
    warn_renamed(old, new)
    sys.modules[old] = importlib.import_module(new)
    for sub in submodules:
        sys.modules[f"{old}.{sub}"] = importlib.import_module(f"{new}.{sub}")


def renamed_names(module: str, renames: Mapping[str, str],
                  fallback: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``renames`` (old name → new name of the same module), with a
    warning each time; other names go to ``fallback`` (e.g. the module's lazy exports)."""

    def module_getattr(name: str) -> Any:
        new = renames.get(name)
        if new is None:
            if fallback is not None:
                return fallback(name)
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_renamed(f"{module}.{name}", f"{module}.{new}")
        return getattr(importlib.import_module(module), new)

    return module_getattr
