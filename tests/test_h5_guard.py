"""HDF5 files from someone else that reach outside themselves or claim more than they can hold
(issue 54): every file pbg opens for reading is refused as it opens, before any link is followed
or any data read, by ``pbgio validate`` (an issue, exit 1) and by every reader (``FormatError``).

- ``h5-external-link``: an external link (to /etc/passwd, to another project's bucket, to a FIFO),
  a dataset with external raw storage (a secrets file), a virtual dataset (another file's edges);
- ``h5-size-bound``: a gzip chunk that inflates to 2 GiB, a compressed dataset that claims far more
  than 1032 times its stored bytes (HDF5 fills the rest with whatever its buffer held).

Each case breaks bucket ``edges_0_0.h5`` of a small valid layout (or a checkpoint file), so that
nothing else in the layout is wrong.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from pbgio.checkpoint import CheckpointDir
from pbgio.edges import read_bucket
from pbgio.errors import FormatError
from pbgio.spec.rules import RULES
from pbgio.testing.layouts import small_valid_layout, write_layout
from pbgio.validate import validate_path
from tests.cli import pbgio

Build = Callable[[h5py.File, dict[str, np.ndarray[Any, Any]], Path], None]
SECRET = b"AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"


def _layout(tmp_path: Path) -> Path:
    """The config of a small valid layout (no featurized types: the bucket holds rel, lhs, rhs, weight)."""
    return write_layout(tmp_path / "layout", small_valid_layout(featurized=False))


def _bucket(config: Path) -> Path:
    return config.parent / "edges" / "edges_0_0.h5"


def _break_bucket(config: Path, build: Build) -> None:
    """Rebuild the bucket's datasets with ``build(file, old datasets, folder outside the layout)``."""
    outside = config.parent.parent / "outside"
    outside.mkdir(exist_ok=True)
    with h5py.File(_bucket(config), "r+") as f:
        values = {name: f[name][...] for name in ("rel", "lhs", "rhs", "weight")}
        build(f, values, outside)


def _other_bucket(outside: Path, values: dict[str, np.ndarray[Any, Any]]) -> Path:
    """Another project's bucket, outside the layout: edges a reader of this layout must never see."""
    other = outside / "edges_0_0.h5"
    with h5py.File(other, "w") as f:
        f["lhs"] = np.zeros_like(values["lhs"])  # valid offsets: the old code read them as this bucket's
    return other


def _external_link_to_passwd(f: h5py.File, values: dict[str, Any], outside: Path) -> None:
    del f["lhs"]
    f["lhs"] = h5py.ExternalLink("/etc/passwd", "/lhs")


def _external_link_to_other_bucket(f: h5py.File, values: dict[str, Any], outside: Path) -> None:
    other = _other_bucket(outside, values)
    del f["lhs"]
    f["lhs"] = h5py.ExternalLink(str(other), "/lhs")


def _external_storage_in_secret(f: h5py.File, values: dict[str, Any], outside: Path) -> None:
    secret = outside / "secrets.env"
    secret.write_bytes(SECRET)
    del f["lhs"]
    f.create_dataset("lhs", shape=values["lhs"].shape, dtype=np.int64, external=[(str(secret), 0, h5py.h5f.UNLIMITED)])


def _virtual_dataset_of_other_file(f: h5py.File, values: dict[str, Any], outside: Path) -> None:
    other = _other_bucket(outside, values)
    layout = h5py.VirtualLayout(shape=values["lhs"].shape, dtype=np.int64)
    layout[...] = h5py.VirtualSource(str(other), "lhs", shape=values["lhs"].shape)
    del f["lhs"]
    f.create_virtual_dataset("lhs", layout)


def _gzip_chunk_of_2_gib(f: h5py.File, values: dict[str, Any], outside: Path) -> None:
    from pbgio.testing.mutations import deflated_zeros

    del f["lhs"]
    ds = f.create_dataset("lhs", shape=values["lhs"].shape, maxshape=(None,), dtype=np.int64,
                          chunks=((2 << 30) // 8,), compression="gzip")
    ds.id.write_direct_chunk((0,), deflated_zeros(values["lhs"].tobytes(), 2 << 30))  # 2 MB that inflate to 2 GiB


CLAIMED_ROWS = 1 << 22  # 32 MiB a dataset, in chunks of 8 MiB that each store a few bytes


def _compressed_claims_beyond_its_bytes(f: h5py.File, values: dict[str, Any], outside: Path) -> None:
    for name, data in values.items():
        del f[name]
        ds = f.create_dataset(name, shape=(CLAIMED_ROWS,), dtype=data.dtype, chunks=(CLAIMED_ROWS // 4,),
                              compression="gzip")
        for start in range(0, CLAIMED_ROWS, CLAIMED_ROWS // 4):  # every chunk written: the real rows, deflated
            ds.id.write_direct_chunk((start,), zlib.compress(data.tobytes()))


CASES: dict[str, tuple[Build, str, str]] = {
    "external link to /etc/passwd": (_external_link_to_passwd, "h5-external-link", "/etc/passwd"),
    "external link to another bucket": (_external_link_to_other_bucket, "h5-external-link", "outside/edges_0_0.h5"),
    "external storage in a secrets file": (_external_storage_in_secret, "h5-external-link", "secrets.env"),
    "virtual dataset of another file": (_virtual_dataset_of_other_file, "h5-external-link", "outside/edges_0_0.h5"),
    "gzip chunk of 2 GiB": (_gzip_chunk_of_2_gib, "h5-size-bound", "2,147,483,648 bytes"),
    "claims beyond 1032x its bytes": (_compressed_claims_beyond_its_bytes, "h5-size-bound", "1032:1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_and_reader_refuse_the_file(tmp_path: Path, case: str) -> None:
    build, rule_id, named = CASES[case]
    config = _layout(tmp_path)
    _break_bucket(config, build)
    report = validate_path(config)
    assert not report.ok
    found = [i for i in report.errors if i.rule == rule_id]
    assert found and found[0].file == "edges/edges_0_0.h5" and found[0].dataset in ("lhs", "rel"), report.issues
    assert named in found[0].message
    with pytest.raises(FormatError) as err:
        read_bucket(_bucket(config))
    assert err.value.rule == rule_id and str(_bucket(config)) in str(err.value)


@pytest.mark.parametrize("case", ["external link to another bucket", "gzip chunk of 2 GiB"])
def test_cli_validate_reports_the_rule(tmp_path: Path, case: str) -> None:
    build, rule_id, _ = CASES[case]
    config = _layout(tmp_path)
    _break_bucket(config, build)
    done = pbgio("validate", str(config))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"[{rule_id}]" in done.stderr and "Traceback" not in done.stderr + done.stdout


@contextlib.contextmanager
def _unblocked_after(fifo: Path, seconds: float) -> Iterator[None]:
    """A watchdog for code that would hang opening ``fifo`` for reading: after ``seconds``, and then
    every tenth of a second, another process opens it for writing and closes it, which lets a blocked
    reader go on (it reads an empty file), so that the test fails instead of hanging. A process, not a
    thread: h5py holds the GIL while HDF5 waits in ``open``."""
    watchdog = subprocess.Popen(["sh", "-c", f'sleep {seconds}; while :; do : > "$0"; sleep 0.1; done', str(fifo)])
    try:
        yield
    finally:
        watchdog.kill()
        watchdog.wait()


def test_external_link_to_a_fifo_does_not_hang(tmp_path: Path) -> None:
    config = _layout(tmp_path)
    fifo = tmp_path / "fifo.h5"
    os.mkfifo(fifo)

    def link_to_fifo(f: h5py.File, values: dict[str, Any], outside: Path) -> None:
        del f["lhs"]
        f["lhs"] = h5py.ExternalLink(str(fifo), "/lhs")

    _break_bucket(config, link_to_fifo)
    with _unblocked_after(fifo, 20):
        started = time.monotonic()
        done = pbgio("validate", str(config))
        with pytest.raises(FormatError) as err:
            read_bucket(_bucket(config))
        elapsed = time.monotonic() - started
    assert done.returncode == 1 and "[h5-external-link]" in done.stderr, done.stderr
    assert err.value.rule == "h5-external-link" and str(fifo) in str(err.value)
    assert elapsed < 15, f"took {elapsed:.1f} s: the FIFO was opened"


def test_checkpoint_reader_refuses_external_data(tmp_path: Path) -> None:
    """The checkpoint's files too: an embeddings table linked to another file, a model parameter
    stored in a secrets file."""
    config = _layout(tmp_path)
    ckpt = CheckpointDir(config.parent / "checkpoint")
    outside = tmp_path / "outside"
    outside.mkdir()
    with h5py.File(ckpt.embeddings_path("user", 0, 1), "r+") as f:
        rows = f["embeddings"].shape
        with h5py.File(outside / "embeddings.h5", "w") as other:
            other["embeddings"] = np.ones(rows, np.float32)
        del f["embeddings"]
        f["embeddings"] = h5py.ExternalLink(str(outside / "embeddings.h5"), "/embeddings")
    with pytest.raises(FormatError) as err:
        ckpt.read_embeddings("user", 0, 1)
    assert err.value.rule == "h5-external-link" and err.value.dataset == "embeddings"
    secret = outside / "secrets.env"
    secret.write_bytes(SECRET)
    with h5py.File(ckpt.model_path(1), "r+") as f:
        name = next(n for n, o in _datasets(f["model"]))
        shape = f["model"][name].shape
        del f["model"][name]
        f["model"].create_dataset(name, shape=shape, dtype=np.float32, external=[(str(secret), 0, h5py.h5f.UNLIMITED)])
    with pytest.raises(FormatError) as err:
        ckpt.read_model(1)
    assert err.value.rule == "h5-external-link" and "secrets.env" in str(err.value)
    report = validate_path(config)
    assert {"h5-external-link"} <= {i.rule for i in report.errors}


def _datasets(group: h5py.Group) -> list[tuple[str, h5py.Dataset]]:
    found: list[tuple[str, h5py.Dataset]] = []
    group.visititems(lambda name, obj: found.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
    return found


def test_benign_files_still_open(tmp_path: Path) -> None:
    """Soft links, a second hard link to a dataset, gzip, shuffle and fletcher32 within their bounds:
    the guard refuses none of them (soft links resolve inside the file)."""
    config = _layout(tmp_path)

    def benign(f: h5py.File, values: dict[str, Any], outside: Path) -> None:
        for name, data in values.items():
            del f[name]
            f.create_dataset(name, data=data, chunks=(4,), compression="gzip", shuffle=True, fletcher32=True)
        f["extra"] = h5py.SoftLink("/lhs")
        f["group/again"] = f["rel"]  # the same dataset reached twice: walked once
        f["group/loop"] = f["group"]

    _break_bucket(config, benign)
    assert read_bucket(_bucket(config)).lhs.tolist() == _lhs(config)
    report = validate_path(config)
    assert not {"h5-external-link", "h5-size-bound"} & {i.rule for i in report.issues}, report.issues


def _lhs(config: Path) -> list[int]:
    with h5py.File(_bucket(config), "r") as f:
        return [int(v) for v in f["lhs"][...]]


def test_rule_texts_state_the_bounds() -> None:
    from pbgio.checks.hdf5 import DEFLATE_MAX_RATIO, MAX_FILTERED_CHUNK_BYTES

    text = RULES["h5-size-bound"].text
    assert f"{MAX_FILTERED_CHUNK_BYTES >> 20} MiB" in text and f"{DEFLATE_MAX_RATIO}" in text
    assert "external link" in RULES["h5-external-link"].text and "virtual dataset" in RULES["h5-external-link"].text
