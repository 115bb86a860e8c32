"""tests/shared.py: a test that needs ../shared skips, saying what it needs, or fails under
PBG_REQUIRE_SHARED=1 (as in .ci/run); the reference samples are in the repository."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests import shared


def test_absent_shared_file_skips_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "SHARED", tmp_path / "shared")
    monkeypatch.delenv(shared.REQUIRE_SHARED, raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        shared.shared_path("datasets", "nope.tar.gz")
    assert "needs ../shared/datasets/nope.tar.gz" in str(skipped.value)
    assert ".ci/run requires it" in str(skipped.value)


def test_absent_shared_file_fails_when_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "SHARED", tmp_path / "shared")
    monkeypatch.setenv(shared.REQUIRE_SHARED, "1")
    with pytest.raises(pytest.fail.Exception) as failed:
        shared.shared_path("datasets", "nope.tar.gz")
    assert "needs ../shared/datasets/nope.tar.gz" in str(failed.value)


def test_present_shared_file_is_returned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shared" / "datasets").mkdir(parents=True)
    (tmp_path / "shared" / "datasets" / "here.tar.gz").write_bytes(b"")
    monkeypatch.setattr(shared, "SHARED", tmp_path / "shared")
    monkeypatch.setenv(shared.REQUIRE_SHARED, "1")
    assert shared.shared_path("datasets", "here.tar.gz") == tmp_path / "shared" / "datasets" / "here.tar.gz"


def test_the_samples_in_the_repository_are_the_indexed_ones() -> None:
    """Every case of INDEX.json is there with every file its case.json lists, byte for byte."""
    index = json.loads((shared.SAMPLES / "INDEX.json").read_text())
    assert len(index) == 4
    for case in index:
        folder = shared.SAMPLES / case["name"]
        files = json.loads((folder / "case.json").read_text())["details"]["files"]
        for name, info in files.items():
            data = (folder / name).read_bytes()
            assert len(data) == info["size"] and hashlib.sha256(data).hexdigest() == info["sha256"], name
