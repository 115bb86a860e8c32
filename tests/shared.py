"""Where the tests find files they do not build: the golden samples kept in the repository, and
the project's shared folder (``../shared``, the sibling of the checkout: datasets, the original
PyTorch-BigGraph's wheel).

Every test that needs ``../shared`` gets its path from :func:`shared_path`, which skips the test
when the file is absent, saying what it needs, and fails it instead under ``PBG_REQUIRE_SHARED=1``
(which ``.ci/run`` sets, so that CI cannot pass without those tests).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SAMPLES = REPO / "tests" / "data" / "samples"
"""The original's reference samples (a copy of ``../shared/reference/samples``: 4 small cases)."""
REQUIRE_SHARED = "PBG_REQUIRE_SHARED"


def shared_missing_reason(*parts: str) -> str:
    """Why a test that needs ``../shared/<parts>`` cannot run."""
    return (f"needs ../shared/{'/'.join(parts)} (the project's shared folder beside the checkout, "
            f"{SHARED}; .ci/run requires it)")


def shared_path(*parts: str) -> Path:
    """``../shared/<parts>``; skips the calling test when it is absent (fails it under
    ``PBG_REQUIRE_SHARED=1``). Call it from a test or a fixture, not at import time."""
    path = SHARED.joinpath(*parts)
    if path.exists():
        return path
    reason = shared_missing_reason(*parts)
    if os.environ.get(REQUIRE_SHARED) == "1":
        pytest.fail(f"{reason}; {REQUIRE_SHARED}=1 makes its absence a failure", pytrace=False)
    pytest.skip(reason)
