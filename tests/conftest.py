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

Under pytest-xdist (the default run, ``-n auto``: one worker per core) the processes a worker's
tests start (the command lines), and the worker until a fit sets its own thread count, compute on
one thread (``OMP_NUM_THREADS=1``, set before torch is imported): a worker per core already uses
every core, and torch's own threads on top of it made the 2-core run 10 % slower (89 s against
81 s, measured 2026-11-26).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

if "PYTEST_XDIST_WORKER" in os.environ:  # before any test module imports torch
    os.environ["OMP_NUM_THREADS"] = "1"

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
