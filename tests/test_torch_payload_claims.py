"""What a torch.save payload claims is not allocated before it is read (found by the guided
fuzzer: docs/guides/fuzzing.md). CPython's unpickler grows its memo to the slot a PUT names and
allocates a counted string at its claimed length; pbgio.formats.torch_payload walks the pickle
first and refuses such claims, naming the opcode and its byte."""

from __future__ import annotations

import io
import pickle
import resource
import struct

import pytest
import torch

from pbgio.formats.torch_payload import PayloadError, read_payload
from pbgio.testing import fuzzrun


def _zip_payload(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _legacy_with(last_pickle: bytes) -> bytes:
    """A legacy container whose tensor pickle is ``last_pickle``."""
    head = b"".join(pickle.dumps(v, protocol=2) for v in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}))
    return head + last_pickle


@pytest.fixture
def bounded_memory() -> object:
    """1 GB more address space than now, as the fuzz harness gives a reader."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (fuzzrun._vm_bytes() + (1 << 30), hard))
    yield None
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_memo_slot_far_past_those_filled_is_refused(bounded_memory: object) -> None:
    evil = b"\x80\x02]q\x00r" + struct.pack("<I", 1141532771) + b"."  # LONG_BINPUT 1,141,532,771
    with pytest.raises(PayloadError, match=r"LONG_BINPUT at byte \d+ puts memo slot 1,141,532,771 after 1"):
        read_payload(_legacy_with(evil))


def test_a_counted_bytes_claiming_more_than_the_payload_is_refused(bounded_memory: object) -> None:
    evil = b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"abc."  # BINBYTES8 of a terabyte
    with pytest.raises(PayloadError, match="the pickle is unreadable"):
        read_payload(_legacy_with(evil))


def test_valid_payloads_still_read() -> None:
    value = {"sum": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": [1, 2, 3] * 50}
    payload = read_payload(_zip_payload(value))
    assert payload.array(payload.value["sum"]).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert payload.value["n"] == [1, 2, 3] * 50


@pytest.mark.parametrize("claim", [1 << 40, (1 << 63) + 5])
def test_a_bare_pickle_frame_claiming_more_than_the_file_is_refused(tmp_path, bounded_memory: object,
                                                                     claim: int) -> None:
    """A legacy .pt written as a bare pickle: its FRAME claims terabytes (MemoryError) or more than
    an int64 (OverflowError) in a few bytes; found by the 15-minute guided run of the legacy family."""
    from pbgio.errors import FormatError
    from pbgio.legacy.pickles import load_pickle

    path = tmp_path / "entity_count_user_0.pt"
    path.write_bytes(b"\x80\x04\x95" + struct.pack("<Q", claim % (1 << 64)) + b"K\x07.")
    with pytest.raises(FormatError, match="FRAME at byte 2 claims"):
        load_pickle(path)
