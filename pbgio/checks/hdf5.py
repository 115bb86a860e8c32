"""The HDF5 rules every ``.h5`` file of the format keeps: ``h5-unreadable``, ``h5-format-version``.

>>> print(format_version("edges_0_0.h5", None))
edges_0_0.h5: expected root attribute format_version=1, found none [h5-format-version]
>>> format_version("edges_0_0.h5", 1) is None
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pbgio.errors import Issue
from pbgio.spec import FORMAT_VERSION, FORMAT_VERSION_ATTR
from pbgio.spec.rules import rule


def unreadable(file: str | None, dataset: str | None, message: str) -> Issue:
    """``h5-unreadable``: the file does not open as HDF5, or does not store what it claims
    (``message`` says what was expected and found: a signature, bytes, chunks, intact structures)."""
    return rule("h5-unreadable").issue(file, dataset, message)


def format_version(file: str | None, found: Any) -> Issue | None:
    """``h5-format-version``: ``found``, the root attribute ``format_version`` (None: absent), is 1."""
    if _is_version(found):
        return None
    return rule("h5-format-version").issue(
        file, None, f"expected root attribute {FORMAT_VERSION_ATTR}={FORMAT_VERSION}, "
        f"found {'none' if found is None else repr(found)}")


def _is_version(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        if value.size != 1:
            return False
        value = value.reshape(()).item()
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and int(value) == FORMAT_VERSION
