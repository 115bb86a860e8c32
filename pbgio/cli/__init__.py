"""The ``pbgio`` command line (the top layer of :mod:`pbgio`).

- :mod:`~pbgio.cli.commands`: the Typer ``app`` and ``main`` (``pbgio validate``, ``info``, ``example`` …).
- :mod:`~pbgio.cli.importing`, :mod:`~pbgio.cli.exporting`, :mod:`~pbgio.cli.converting`,
  :mod:`~pbgio.cli.indexing`, :mod:`~pbgio.cli.finding`: ``pbgio import``, ``pbgio export``,
  ``pbgio convert``, ``pbgio index``, ``pbgio names``.

What every pbg command line shares (with ``pbgtrain``'s) lives in the base layer:
:mod:`pbgio.console` (exit codes, messages) and :mod:`pbgio.options` (the options defined once).

The console script is ``pbgio.cli:main``, exported lazily: importing ``pbgio.console``
does not import the app and its commands.
"""

from __future__ import annotations

from typing import Any

from pbgio.lazy import lazy_exports

__all__, _export = lazy_exports("pbgio.cli", {"pbgio.cli.commands": ["app", "main"]})


def __getattr__(name: str) -> Any:
    return _export(name)
