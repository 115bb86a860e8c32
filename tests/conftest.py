"""Hypothesis profiles and shared fixtures.

Profiles (``HYPOTHESIS_PROFILE=dev|ci|thorough``; with ``CI`` set in the environment the default
is ``ci``, otherwise ``dev``):

* ``dev``: few examples per property (10), so that the default run stays fast;
* ``ci``: as few, derandomized (the same examples every run) and without the example database,
  for CI's fast step;
* ``thorough``: 20 times as many (200 per property), for CI's slow step (``.ci/run``) and bug hunts.

A property that states its own ``max_examples`` states it for the default profile of hypothesis
(100 examples): :func:`tests.profiles.examples` scales it to the profile in use. Deadlines are off:
the properties write and read real files, whose timing varies with the disk.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.profiles import load_profile
from tests.shared import SAMPLES

load_profile()


FEATURIZED_SAMPLE = SAMPLES / "sample_current_featurized"


@pytest.fixture
def featurized_sample(tmp_path: Path) -> Path:
    """A writable copy of the original's featurized sample (tests/data/samples)."""
    dest = tmp_path / "sample"
    shutil.copytree(FEATURIZED_SAMPLE, dest)
    for path in dest.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest
