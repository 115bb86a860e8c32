"""Hypothesis profiles: ``dev`` (default) and ``ci`` (derandomized, fewer examples); shared fixtures.

Pick one with ``HYPOTHESIS_PROFILE=dev|ci`` (or ``thorough``, for a long bug hunt); with
``CI`` set in the environment the default is ``ci``. Deadlines are off: the properties write
and read real files, whose timing varies with the disk.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

from tests.shared import SAMPLES

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True, database=None,
                          print_blob=True)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


FEATURIZED_SAMPLE = SAMPLES / "sample_current_featurized"


@pytest.fixture
def featurized_sample(tmp_path: Path) -> Path:
    """A writable copy of the original's featurized sample (tests/data/samples)."""
    dest = tmp_path / "sample"
    shutil.copytree(FEATURIZED_SAMPLE, dest)
    for path in dest.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest
