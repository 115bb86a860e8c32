"""Interop suite: our files and trainer against the ORIGINAL PyTorch-BigGraph, both ways.

Run it with ``python -m pytest -m interop`` (the default run leaves it out). The original is
installed once per pytest run into a side virtual environment:

* wheel absent (``../shared/reference/original/``): every interop test is skipped, naming it
  (under ``PBG_REQUIRE_SHARED=1``, as in ``.ci/run``, they fail instead: tests/shared.py);
* ``PBG_ORIGINAL_VENV`` names a venv where ``import torchbiggraph`` works: it is reused
  (``PBG_ORIGINAL_VENV=~/.cache/pbg-original-venv`` to iterate fast);
* otherwise a venv is created (at ``PBG_ORIGINAL_VENV`` when set, else in pytest's temporary
  directory) with ``python -m venv`` and ``pip install -r original-requirements.txt``; an
  install failure is an error, not a skip.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from interop_harness import WHEEL, Original, create_original_venv, original_importable  # noqa: E402

from tests.shared import shared_path  # noqa: E402

# Run by the original's interpreter only: it imports torchbiggraph, which our venv lacks.
collect_ignore = ["original_driver.py"]


@pytest.fixture(scope="session")
def original(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Original]:
    """The original PyTorch-BigGraph in a side virtual environment (created once per run)."""
    shared_path("reference", "original", WHEEL.name)  # skips (fails under PBG_REQUIRE_SHARED=1) without it
    requested = os.environ.get("PBG_ORIGINAL_VENV")
    if requested and original_importable(Path(requested)):
        yield Original(Path(requested))
        return
    venv = Path(requested) if requested else tmp_path_factory.mktemp("original-venv") / "venv"
    started = time.monotonic()
    create_original_venv(venv)  # raises on failure: an error, not a skip
    print(f"\ncreated the original's environment at {venv} in {time.monotonic() - started:.0f} s")
    yield Original(venv)
