"""The import/export guide runs: every example in docs/guides/import-export.md is a doctest."""

from __future__ import annotations

import doctest
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "import-export.md"


def test_import_export_guide_runs() -> None:
    result = doctest.testfile(str(GUIDE), module_relative=False,
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 25
    assert result.failed == 0
