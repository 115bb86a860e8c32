"""Datasets that claim more than the file stores (created, never written: HDF5 reads fill values)
are truncated files in disguise: every reader and the validator report them at once, naming file
and dataset, without reading or allocating the claimed size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.edges import read_bucket
from pbgio.errors import CorruptFileError, FormatError
from pbgio.spec.checkpoint import EMBEDDINGS_DATASET, MODEL_GROUP, OPTIMIZER_DATASET
from pbgio.testing.layouts import small_valid_layout, write_layout
from pbgio.validate import validate_path

CLAIMED = 10**12


def _layout(tmp_path: Path) -> Path:
    """The root of a small valid layout (its config.json, entities, edges and checkpoint)."""
    return write_layout(tmp_path / "layout", small_valid_layout(featurized=False)).parent


def _claim(path: Path, dataset: str, rows: int = CLAIMED, dtype: str = "int64", chunked: bool = True) -> None:
    """Replace ``dataset`` of ``path`` by one that claims ``rows`` rows and stores none of them."""
    with h5py.File(path, "r+") as f:
        shape = (rows, *f[dataset].shape[1:])
        del f[dataset]
        f.create_dataset(dataset, shape=shape, dtype=dtype, chunks=(min(rows, 1 << 16), *shape[1:])
                         if chunked else None)


def _bucket(root: Path) -> Path:
    return next(root.rglob("edges_0_0.h5"))


@pytest.mark.parametrize("dataset", ["rel", "lhs", "rhs"])
def test_bucket_claiming_rows_it_never_stored_is_a_truncated_file(tmp_path: Path, dataset: str) -> None:
    bucket = _bucket(_layout(tmp_path))
    _claim(bucket, dataset)
    with pytest.raises(FormatError) as err:
        read_bucket(bucket)
    assert err.value.dataset == dataset and str(bucket) in str(err.value)
    assert err.value.rule in ("h5-unreadable", "edge-length-mismatch")
    for name in ("rel", "lhs", "rhs"):
        _claim(bucket, name)
    with pytest.raises(CorruptFileError) as err:
        read_bucket(bucket)
    assert err.value.rule == "h5-unreadable" and err.value.dataset == "rel" and "truncated" in str(err.value)


def test_validate_reports_a_claimed_bucket_at_once(tmp_path: Path) -> None:
    """The issue's report: a 2 KB bucket whose three datasets claim 10^12 rows kept validate busy
    past any timeout. The CLI now ends at once (the subprocess timeout is a hang guard)."""
    root = _layout(tmp_path)
    bucket = _bucket(root)
    for name in ("rel", "lhs", "rhs"):
        _claim(bucket, name)
    assert bucket.stat().st_size < 64 * 1024
    done = subprocess.run([sys.executable, "-m", "pbgio", "validate", str(bucket)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "[h5-unreadable]" in done.stderr and "expected 15,258,790 chunks" in done.stderr
    assert "invalid" in done.stderr and "1,000,000,000,000 edges" not in done.stderr
    report = validate_path(root / "config.json")
    issues = [i for i in report.errors if i.rule == "h5-unreadable"]
    assert sorted(i.dataset for i in issues if i.dataset) == ["lhs", "rel", "rhs"]
    assert all(i.file == "edges/edges_0_0.h5" for i in issues)


def test_partly_written_bucket_is_caught(tmp_path: Path) -> None:
    """A writer that grew its datasets and died before filling them."""
    bucket = _bucket(_layout(tmp_path))
    with h5py.File(bucket, "r+") as f:
        n = f["lhs"].shape[0]
        values = f["lhs"][()]
        del f["lhs"]
        ds = f.create_dataset("lhs", shape=(n,), maxshape=(None,), chunks=(4,), dtype="int64")
        ds[:4] = values[:4]  # the first chunk only
    with pytest.raises(CorruptFileError, match=r"expected \d+ chunks .* found 1 written"):
        read_bucket(bucket)


def test_contiguous_dataset_never_written(tmp_path: Path) -> None:
    bucket = _bucket(_layout(tmp_path))
    _claim(bucket, "rhs", rows=1000, chunked=False)
    with pytest.raises(CorruptFileError, match="found 0 written"):
        read_bucket(bucket)


def _checkpoint_file(root: Path, pattern: str) -> Path:
    return next(root.rglob(pattern))


@pytest.mark.parametrize(("pattern", "dataset", "dtype"), [
    ("embeddings_user_0.v1.h5", EMBEDDINGS_DATASET, "float32"),
    ("embeddings_user_0.v1.h5", OPTIMIZER_DATASET, "V1"),
    ("model.v1.h5", OPTIMIZER_DATASET, "V1"),
])
def test_checkpoint_files_claiming_unwritten_data(tmp_path: Path, pattern: str, dataset: str, dtype: str) -> None:
    root = _layout(tmp_path)
    file = _checkpoint_file(root, pattern)
    _claim(file, dataset, dtype=dtype)
    ckpt = CheckpointDir(file.parent)
    read = (lambda: ckpt.read_model(1)) if pattern.startswith("model") else (lambda: ckpt.read_embeddings("user", 0, 1))
    with pytest.raises(CorruptFileError) as err:
        read()
    assert err.value.dataset == dataset
    report = validate_path(file)
    assert [i.dataset for i in report.errors if i.rule == "h5-unreadable"] == [dataset]


def test_model_parameter_claiming_unwritten_data(tmp_path: Path) -> None:
    root = _layout(tmp_path)
    file = _checkpoint_file(root, "model.v1.h5")
    names: list[str] = []
    with h5py.File(file, "r") as f:
        f[MODEL_GROUP].visititems(lambda n, item: names.append(n) if isinstance(item, h5py.Dataset) else None)
    _claim(file, f"{MODEL_GROUP}/{names[0]}", dtype="float32")
    with pytest.raises(CorruptFileError, match="truncated"):
        CheckpointDir(file.parent).read_model(1)


def test_written_files_pass_the_check(tmp_path: Path) -> None:
    """The check does not flag what writers produce (every sample layout validates clean)."""
    root = _layout(tmp_path)
    assert validate_path(root / "config.json").ok
    edges = read_bucket(_bucket(root))
    assert len(edges) > 0 and np.all(edges.rel >= 0)
