"""Legacy layouts from strangers (issue 54): what ``pbgio convert --from legacy`` reads is what it checked.

- The pickle allow-list scans the member torch loads: torch's zip reader finds ``data.pkl``
  case-insensitively under the folder of the archive's first member; two members it would confuse
  are refused (a decoy ``data.pkl`` beside the ``DATA.PKL`` torch loads).
- What a file declares is bounded by what it holds before anything is allocated: a 4 MB zip whose
  storage inflates to 4 GiB, a pre-1.6 container whose pickle declares 4 GiB.
- Every file the legacy reader opens is a regular file whose links stay inside SRC, count files read
  within a size cap (a FIFO, a link to ``/dev/zero``, a link out of SRC, a huge count).
- The legacy bucket reader refuses what the current readers refuse: external raw storage (another
  file's bytes, copied into DST) and rows claimed but never written (terabytes of zeros from 2 KB).

Each test fails on the code before this change (there it loads the other pickle, allocates or writes
gigabytes, follows the link, or copies the secret). Resource limits keep such a failure small: the
address space and the size of a written file are capped around the calls that would blow up.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import pickle
import re
import resource
import signal
import struct
import time
import tracemalloc
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from pbgio.errors import FormatError, UnsafePickleError
from pbgio.legacy.pickles import inspect_pickle, load_pickle
from pbgio.testing.legacy_layouts import LegacySpec, write_legacy_layout
from tests.cli import pbgio
from tests.deadline import deadline as _deadline

MIB = 1 << 20


def _status(field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert found is not None
    return int(found[1]) << 10


@contextlib.contextmanager
def _address_space(headroom: int) -> Iterator[None]:
    """At most ``headroom`` bytes more address space in the body (an allocation of gigabytes fails)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _status("VmSize") + headroom
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def _file_size(limit: int) -> Iterator[None]:
    """No file written past ``limit`` bytes in the body (the write fails instead of filling the disk)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def _reset_peak_rss() -> bool:
    """Reset this process's peak resident size (VmHWM); False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------- torch zips, built by hand


def _members(obj: Any) -> list[tuple[str, bytes]]:
    """The members of ``torch.save(obj)``, in the archive's order."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with zipfile.ZipFile(buffer) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def _zip(path: Path, members: list[tuple[str, bytes]], prefix: bytes = b"") -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for name, data in members:
            out.writestr(name, data)
    if prefix:
        path.write_bytes(prefix + path.read_bytes())
    return path


def _raw_zip(path: Path, members: list[tuple[str, bytes, int, int, int]]) -> Path:
    """A zip of ``(name, stored bytes, method, crc32, uncompressed size)`` members, written as they come
    (a deflate stream written as is: zipfile would inflate it to compute its checksum)."""
    body, central = bytearray(), bytearray()
    for name, data, method, crc, size in members:
        raw = name.encode()
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, len(data), size,
                               len(raw), 0, 0, 0, 0, 0, len(body)) + raw
        body += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(data), size, len(raw), 0)
        body += raw + data
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), len(body), 0)
    path.write_bytes(bytes(body + central + end))
    return path


def _crc_of_zeros(size: int) -> int:
    """``zlib.crc32(bytes(size))`` without the bytes: over zeros, crc32 is an affine map of its start
    value, composed with itself once per megabyte (by squaring)."""
    zeros = bytes(MIB)
    base = zlib.crc32(zeros, 0)
    step = ([zlib.crc32(zeros, 1 << i) ^ base for i in range(32)], base)

    def apply(m: tuple[list[int], int], value: int) -> int:
        out = m[1]
        for i in range(32):
            if value >> i & 1:
                out ^= m[0][i]
        return out

    def then(g: tuple[list[int], int], h: tuple[list[int], int]) -> tuple[list[int], int]:
        return [apply(g, col) ^ g[1] for col in h[0]], apply(g, h[1])

    total: tuple[list[int], int] = ([1 << i for i in range(32)], 0)
    blocks = size // MIB
    while blocks:
        if blocks & 1:
            total = then(step, total)
        step = then(step, step)
        blocks >>= 1
    return zlib.crc32(bytes(size % MIB), apply(total, 0))


def _deflated_zeros(size: int) -> bytes:
    """A raw deflate stream of ``size`` zero bytes, about ``size / 1000`` long (a block of a fresh
    compressor ends on a full flush, so it is valid anywhere in the stream)."""
    def block(n: int) -> bytes:
        compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
        return compressor.compress(bytes(n)) + compressor.flush(zlib.Z_FULL_FLUSH)

    tail = block(size % MIB) if size % MIB else b""
    return block(MIB) * (size // MIB) + tail + zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)


class _Storage:
    pass


def _tensor_pickle(elements: int, value: Any, *, zipped: bool) -> bytes:
    """The pickle ``torch.save`` writes for ``value`` (a ``Tensor`` stands for one float32 tensor of
    ``elements`` elements in storage ``"0"``), without the tensor: its storage reference as the zip
    format (``zipped``) or the pre-1.6 container (a sixth field) spells it."""
    storage = _Storage()

    class Tensor:
        def __reduce__(self) -> Any:
            return (torch._utils._rebuild_tensor_v2,
                    (storage, 0, (elements,), (1,), False, collections.OrderedDict()))

    reference = ("storage", torch.FloatStorage, "0", "cpu", elements) + (() if zipped else (None,))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return reference if obj is storage else None

    out = io.BytesIO()
    Pickler(out, protocol=2).dump(value(Tensor))
    return out.getvalue()


def _claiming_pickle(elements: int) -> bytes:
    """A ``data.pkl`` of one float32 tensor of ``elements`` elements in storage ``"0"``: what
    ``torch.save`` writes for such a tensor, without the tensor."""
    return _tensor_pickle(elements, lambda tensor: (tensor(), None), zipped=True)


STORAGE_BYTES = 0xFFFF_FFFC
"""The inflated storage: 4 GiB less 4 bytes (float32 elements; the zip needs no zip64 fields)."""


def _storage_bomb(path: Path) -> Path:
    """An embeddings file of ~4 MB whose one storage inflates to :data:`STORAGE_BYTES` zeros: a torch
    zip torch loads, allocating the storage whole (its checksum is right)."""
    deflated = _deflated_zeros(STORAGE_BYTES)
    members = []
    for name, data in _members((torch.zeros(1), None)):
        if name.endswith("/data.pkl"):
            data = _claiming_pickle(STORAGE_BYTES // 4)
        if name.endswith("/data/0"):
            members.append((name, deflated, zipfile.ZIP_DEFLATED, _crc_of_zeros(STORAGE_BYTES), STORAGE_BYTES))
        else:
            members.append((name, data, zipfile.ZIP_STORED, zlib.crc32(data), len(data)))
    return _raw_zip(path, members)


def test_the_crc_of_zeros_is_zlibs() -> None:
    for size in (0, 5, MIB, 3 * MIB + 7):
        assert _crc_of_zeros(size) == zlib.crc32(bytes(size))
    assert zlib.decompress(_deflated_zeros(2 * MIB + 3), -15) == bytes(2 * MIB + 3)


# --------------------------------------------------------------------------- the member torch loads


@pytest.mark.parametrize("decoy_first", [True, False], ids=["decoy-first", "decoy-second"])
def test_a_decoy_pickle_torch_confuses_with_the_loaded_one_is_refused(tmp_path: Path, decoy_first: bool) -> None:
    genuine = _members(7)
    loaded = dict(_members(collections.Counter(x=1)))["archive/data.pkl"]
    members = list(genuine)
    members.insert(1 if decoy_first else 2, ("archive/DATA.PKL", loaded))
    path = _zip(tmp_path / "entity_count_user_1.pt", members)
    if decoy_first:  # the attack: torch loads DATA.PKL, a scan by exact name reads data.pkl
        assert isinstance(torch.load(path, weights_only=True), collections.Counter)
    with pytest.raises(FormatError, match="legacy-pickle-unreadable") as caught:
        load_pickle(path)
    assert "'archive/data.pkl'" in str(caught.value) and "'archive/DATA.PKL'" in str(caught.value)
    assert "ignoring ASCII case" in str(caught.value)


def test_the_scan_reads_the_pickle_torch_finds_whatever_its_case(tmp_path: Path) -> None:
    members = [("archive/DATA.PKL" if name == "archive/data.pkl" else name, data)
               for name, data in _members(collections.Counter(x=1))]
    path = _zip(tmp_path / "METADATA_1.pt", members)
    assert isinstance(torch.load(path, weights_only=True), collections.Counter)
    with pytest.raises(UnsafePickleError, match=r"collections\.Counter"):
        load_pickle(path)


@pytest.mark.parametrize("case", ["bytes-before", "outside-the-folder"])
def test_a_zip_torch_reads_otherwise_is_refused(tmp_path: Path, case: str) -> None:
    members = _members(7)
    if case == "bytes-before":  # zipfile skips them; torch's reader takes the offsets as they are
        path = _zip(tmp_path / "x.pt", members, prefix=b"PK\x03\x04" + bytes(60))
        expected = "central directory"
    else:  # torch reads only the first member's folder
        path = _zip(tmp_path / "x.pt", [*members, ("other/data.pkl", dict(members)["archive/data.pkl"])])
        expected = "expected every member under archive"
    with pytest.raises(FormatError, match="legacy-pickle-unreadable") as caught:
        inspect_pickle(path)
    assert expected in str(caught.value)


# --------------------------------------------------------------------------- declared sizes


def test_a_deflated_4_gib_storage_is_refused_at_once_without_allocating(tmp_path: Path) -> None:
    path = _storage_bomb(tmp_path / "user_1.pt.1")
    assert path.stat().st_size < 5 * MIB
    measured = _reset_peak_rss()
    tracemalloc.start()
    start = time.monotonic()
    try:
        with _address_space(1 << 30), pytest.raises(FormatError, match="legacy-pickle-unreadable") as caught:
            load_pickle(path)
        elapsed = time.monotonic() - start
        _, traced = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert "archive/data/0" in message and f"{STORAGE_BYTES:,}" in message and "user_1.pt.1" in message
    assert traced < 64 * MIB, (elapsed, traced)  # refused before inflating: no storage allocated
    if measured:
        assert _status("VmHWM") < _status("VmRSS") + 256 * MIB


def _legacy_container(elements: int) -> bytes:
    """A pre-1.6 ``torch.save`` container whose tensor declares ``elements`` float32 elements and
    holds 3."""
    buffer = io.BytesIO()
    torch.save(torch.zeros(3), buffer, _use_new_zipfile_serialization=False)
    stream = io.BytesIO(buffer.getvalue())
    header = b""
    for _ in range(3):  # magic, protocol, sys_info
        start = stream.tell()
        pickle.load(stream)
        header += buffer.getvalue()[start:stream.tell()]
    body = _tensor_pickle(elements, lambda tensor: tensor(), zipped=False)
    return header + body + pickle.dumps(["0"], protocol=2) + struct.pack("<q", 3) + bytes(12)


def test_a_pre_zip_container_declaring_4_gib_is_refused_without_allocating(tmp_path: Path) -> None:
    path = tmp_path / "user_1.pt.1"
    path.write_bytes(_legacy_container(1 << 30))
    with _address_space(1 << 30), pytest.raises(FormatError, match="legacy-pickle-unreadable") as caught:
        load_pickle(path)
    assert "4,294,967,304 bytes" in str(caught.value) and "cannot hold them" in str(caught.value)
    fine = tmp_path / "user_2.pt.1"
    fine.write_bytes(_legacy_container(3))
    assert load_pickle(fine).tolist() == [0.0, 0.0, 0.0]


# --------------------------------------------------------------------------- files the legacy reader opens


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    root = tmp_path / "legacy"
    write_legacy_layout(root, LegacySpec(seed=5))
    return root


def _convert(src: Path, dst: Path) -> Any:
    with _deadline(30):
        return pbgio("convert", "--from", "legacy", str(src), str(dst))


def _refused(done: Any, dst: Path, *needles: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr
    assert not dst.exists()
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}")]  # no staging left


COUNT = "data/entities/entity_count_user_2.pt"


@pytest.mark.parametrize("case", ["fifo", "dev-zero", "outside", "huge"])
def test_a_count_file_is_read_only_as_a_regular_file_inside_src(legacy: Path, tmp_path: Path, case: str) -> None:
    count = legacy / COUNT
    count.unlink()
    expected: tuple[str, ...]
    if case == "fifo":
        os.mkfifo(count)
        expected = ("expected a regular file, found a FIFO", "file-not-regular")
    elif case == "dev-zero":
        count.symlink_to("/dev/zero")
        expected = ("/dev/zero", "layout-link-outside")
    elif case == "outside":  # a genuine count, elsewhere: the old reader read it
        torch.save(5, tmp_path / "elsewhere.pt", _use_new_zipfile_serialization=False)
        count.symlink_to(tmp_path / "elsewhere.pt")
        expected = ("elsewhere.pt", "layout-link-outside")
    else:
        count.write_bytes(b"\x80\x02" + bytes(2 * MIB))
        expected = ("file-too-large",)
    dst = tmp_path / "out"
    _refused(_convert(legacy, dst), dst, COUNT, *expected)


def test_a_link_that_stays_inside_src_is_followed(legacy: Path, tmp_path: Path) -> None:
    count = legacy / COUNT
    kept = legacy / "data" / "kept.pt"
    count.rename(kept)
    count.symlink_to(os.path.relpath(kept, count.parent))
    done = _convert(legacy, tmp_path / "out")
    assert done.returncode == 0, done.stderr


def test_a_version_file_that_is_a_fifo_is_refused_at_once(legacy: Path, tmp_path: Path) -> None:
    version = legacy / "checkpoint" / "CHECKPOINT_VERSION"
    version.unlink()
    os.mkfifo(version)
    dst = tmp_path / "out"
    _refused(_convert(legacy, dst), dst, "CHECKPOINT_VERSION", "FIFO", "file-not-regular")


# --------------------------------------------------------------------------- legacy buckets


BUCKET = "data/train_partitioned/edges_1_1.h5"


def test_a_bucket_with_external_raw_storage_copies_nothing_of_the_other_file(legacy: Path, tmp_path: Path) -> None:
    """The bucket's lhs and rhs are another file's bytes (HDF5 external raw storage), chosen to read
    as valid 1-based ids: the old reader copied them into DST, which validated."""
    rows = 64
    secret = tmp_path / "other_project_edges.bin"
    values = np.array([1 + (i * 7 + i // 5) % 5 for i in range(rows)], dtype="<i8")
    secret.write_bytes(values.tobytes())
    with h5py.File(legacy / BUCKET, "w") as f:
        f["rel"] = np.ones(rows, dtype="<i8")
        for name in ("lhs", "rhs"):
            f.create_dataset(name, shape=(rows,), dtype="<i8", external=[(str(secret), 0, rows * 8)])
    dst = tmp_path / "out"
    done = _convert(legacy, dst)
    _refused(done, dst, "edges_1_1.h5", "external", "other_project_edges.bin")
    copies = [values.tobytes()[:256], (values - 1).tobytes()[:256]]  # as stored, and shifted to 0-based
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and p != secret
              and any(copy in p.read_bytes() for copy in copies)]
    assert leaked == []


@pytest.mark.parametrize("chunked", [False, True], ids=["contiguous", "chunked"])
def test_a_bucket_claiming_1e11_unwritten_rows_is_refused_at_once(legacy: Path, tmp_path: Path, chunked: bool) -> None:
    rows = 10**11
    with h5py.File(legacy / BUCKET, "w") as f:
        for name in ("rel", "lhs", "rhs"):
            f.create_dataset(name, shape=(rows,), dtype="<i8", chunks=(1 << 16,) if chunked else None)
    assert (legacy / BUCKET).stat().st_size < 8192
    dst = tmp_path / "out"
    with _file_size(64 * MIB):  # refused before writing: nothing the size of the claim is written
        done = _convert(legacy, dst)
    _refused(done, dst, "edges_1_1.h5", "100,000,000,000 rows", "fill values")
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) < 16 * MIB
