"""Test helpers shipped with pbgio: valid layouts in memory, hypothesis strategies, mutations.

- :mod:`pbgio.testing.layouts`: :class:`~pbgio.testing.layouts.LayoutContents`, a complete valid
  current layout in memory (named ``Layout`` before; the old name still imports, with a warning),
  :func:`~pbgio.testing.layouts.write_layout` and the deterministic builder
  :func:`~pbgio.testing.layouts.small_valid_layout`. Needs only pbgio's dependencies.
- :mod:`pbgio.testing.strategies`: hypothesis strategies for every artifact (needs the
  ``test`` extra: hypothesis).
- :mod:`pbgio.testing.mutations`: one mutation per rule of :data:`pbgio.spec.rules.RULES`,
  breaking exactly that rule in a written valid layout.
- :mod:`pbgio.testing.edgelists`: a layout's edges read back as names (the inverse of
  ``pbgio import``), for round-trip tests.
- :mod:`pbgio.testing.legacy_layouts`: random legacy (.pt era) layouts written as the 2019
  code did, with what migrating them must give (needs torch).

Only :mod:`~pbgio.testing.strategies` imports hypothesis; import it explicitly.
"""

from __future__ import annotations

from pbgio.deprecation import renamed_names
from pbgio.testing.layouts import (
    CheckpointContents,
    LayoutContents,
    expected_params,
    small_valid_layout,
    write_layout,
)

__all__ = ["CheckpointContents", "LayoutContents", "expected_params", "small_valid_layout", "write_layout"]

__getattr__ = renamed_names(__name__, {"Layout": "LayoutContents", "CheckpointLayout": "CheckpointContents"})
