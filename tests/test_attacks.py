"""The project's attack corpus (issue 54): every attack x command a user runs on a layout from someone else.

Each case builds its attack (:mod:`pbgio.testing.attacks`) under ``tmp_path`` and runs the command as
a user runs it, in a child process, judged by :func:`pbgio.testing.attack_judge.run_attempt`: a clear
refusal naming the file or a safe success; nothing outside the layout changed, created or removed;
no marker of the attacker's code; no traceback, secret or terminal control in the output; no
request to the attacker's host; within 60 s and 2 GiB. Cases of commands that import torch (fit,
eval, predict, convert, report) or whose build is costly are ``slow``.

``PBG_ATTACK_CODE_ROOT=/path/to/checkout`` runs the same cases against another checkout's code (the
code before the change: every case fails there; ``tools/attack_table.py --code-root`` prints the
table).
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from pbgio.testing import attack_payloads as payloads
from pbgio.testing.attack_judge import Attempt, RecordingServer, refused, safe, snapshot
from pbgio.testing.attacks import (
    CATALOGUE,
    CLASSES,
    COMMANDS,
    Attack,
    Setup,
    attempts,
    by_name,
    cases,
    run_attempt,
    scene,
)


def _case_params() -> list[object]:
    return [pytest.param(found, command, id=f"{found.name}-{command}",
                         marks=[pytest.mark.slow] if found.is_slow(command) else [])
            for found, command in cases()]


@pytest.mark.parametrize(("found", "command"), _case_params())
def test_attack(found: Attack, command: str, tmp_path: Path) -> None:
    setup = found.build(tmp_path)
    try:
        verdict = run_attempt(setup, command, attack=found.name)
    finally:
        setup.close()
    assert verdict.held, verdict.explain()


def test_the_corpus_covers_every_class_and_every_command() -> None:
    assert {a.klass for a in CATALOGUE} == set(CLASSES)
    assert {c for a in CATALOGUE for c in a.commands} == set(COMMANDS)


# --------------------------------------------------------------------------- the judge


def test_a_benign_layout_holds_and_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The judge passes a safe command and fails one that does not end as expected."""
    s = scene(tmp_path)
    setup = Setup(tmp_path, attempts(tmp_path, {"validate": safe("valid"), "names": refused("entity_names")}),
                  secrets=(s.secret,))
    good = run_attempt(setup, "validate")
    assert good.held, good.explain()
    assert good.exit_code == 0 and good.peak_rss_mb > 10 and good.seconds > 0
    bad = run_attempt(setup, "names")
    assert not bad.held and bad.failures == ["exit code 0, expected one of [1, 2]"]


def test_the_judge_sees_a_secret_a_victim_change_and_a_marker(tmp_path: Path) -> None:
    """An attempt that writes the secret into a file of the victim's folder, which is also the marker,
    fails on each count: a file created outside the layout, a secret in a written file, the marker
    (the layout's names hold the secret; the export is sent into the victim's folder)."""
    from pbgio.entities import write_entity_names

    s = scene(tmp_path)
    (s.layout / "entities" / "entity_names_user_0.json").unlink()
    write_entity_names(s.layout / "entities", "user", 0, [s.secret, "a", "b", "c", "d"])
    made = attempts(tmp_path, {"export": safe()})
    export = made["export"]
    argv = tuple(str(tmp_path / "victim" / "user.tsv") if a.endswith("user.tsv") else a for a in export.argv)
    marker = tmp_path / "victim" / "user.tsv"
    # the user's word for a write outside the layout (not what this test is about)
    attempt = Attempt(argv, export.expect, env={"PBG_WRITE_OUTSIDE": "1"})
    setup = Setup(tmp_path, {"export": attempt}, secrets=(s.secret,), marker=marker)
    verdict = run_attempt(setup, "export")
    assert any("victim/user.tsv created" in f for f in verdict.failures), verdict.explain()
    assert any("holds the secret" in f for f in verdict.failures), verdict.explain()
    assert any("marker" in f for f in verdict.failures), verdict.explain()


def test_snapshot_records_links_without_following_them(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    os.symlink("/dev/zero", tmp_path / "zero")
    (tmp_path / "file").write_bytes(b"x")
    found = snapshot(tmp_path)
    assert found["zero"] == ("link", "/dev/zero") and found["pipe"][0] == "special" and found["file"][0] == "file"


def test_the_recording_server_records_every_request() -> None:
    import urllib.error
    import urllib.request

    server = RecordingServer()
    try:
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{server.url}/layout/config.json", timeout=5)
        assert server.requests == ["GET /layout/config.json"]
    finally:
        server.close()


# --------------------------------------------------------------------------- the payloads are what they claim


def test_a_gzip_bomb_bucket_is_small_on_disk_and_claims_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "edges_0_0.h5"
    payloads.gzip_bomb_bucket(path, 1 << 24)  # 3 datasets of 128 MiB each
    assert path.stat().st_size < (3 << 27) // 500
    with h5py.File(path) as f:
        assert f["lhs"].shape == (1 << 24,) and f["lhs"].chunks == (1 << 24,)
        assert not f["lhs"][-1000:].any()


def test_the_case_decoy_makes_torch_load_the_other_pickle(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "x.pt"
    torch.save((torch.arange(6.0).reshape(3, 2), None), path)
    genuine = payloads.read_member(path, "/data.pkl")
    payloads.case_decoy(path, payloads.rewrite_pickle(genuine, "data/0", storage_type="IntStorage"))
    with zipfile.ZipFile(path) as archive:
        assert [n for n in archive.namelist() if n.endswith("/data.pkl")] == ["x/decoy/data.pkl"]
        assert archive.read("x/decoy/data.pkl") == genuine
    loaded = torch.load(path, weights_only=True)
    assert loaded[0].dtype == torch.int32  # DATA.PKL, not the decoy


def test_an_inflated_storage_claims_its_size(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "x.pt"
    torch.save((torch.ones(3, 2), None), path)
    payloads.inflated_storage(path, "data/0", 8 << 20)
    assert path.stat().st_size < 50_000
    loaded = torch.load(path, weights_only=True)
    assert loaded[0].shape == (2 << 20,) and not loaded[0].any()


def test_a_faiss_claim_rewrites_the_header_and_the_digest(tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    s = scene(tmp_path, "indexed")
    path = s.layout / "checkpoint" / "index_user.cos.flat.v1.h5"
    payloads.faiss_claim(path, 1 << 30)
    with h5py.File(path) as f:
        payload = np.asarray(f["index"]).tobytes()
        meta = json.loads(f.attrs["pbg_index/json"])
        assert f["index"].chunks is not None and len(payload) == 4096
    assert struct.unpack_from("<Q", payload, 37)[0] == 1 << 30
    import hashlib

    assert meta["payload_sha256"] == hashlib.sha256(payload).hexdigest()


def test_every_attack_builds_what_it_says(tmp_path: Path) -> None:
    """Each cheap attack's layout holds its hostile part (a link out, a FIFO, a marker-writing module)."""
    s = by_name("lock-link-to-victim").build(tmp_path / "a")
    assert (tmp_path / "a" / "layout" / "checkpoint" / ".pbg-lock").resolve() == \
        (tmp_path / "a" / "victim" / ".ssh" / "authorized_keys").resolve()
    s = by_name("count-fifo").build(tmp_path / "b")
    assert (tmp_path / "b" / "layout" / "entities" / "entity_count_user_0.txt").is_fifo()
    s = by_name("json-py-beside-config").build(tmp_path / "c")
    assert s.marker is not None and (tmp_path / "c" / "layout" / "json.py").is_file()
    assert all(a.argv[2] == "config.py" for a in s.attempts.values())
