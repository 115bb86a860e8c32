"""A layout from someone else can neither write nor read outside itself, nor make pbg contact a host of
its choosing (docs/security.md): the scope of a command (:mod:`pbgio.confinement`), the writers that
never follow a link a layout shipped (:mod:`pbgio.storage.atomic`, the checkpoint lock), the
validator's rules of a layout as files (:mod:`pbgio.validate.files`), and ``pbgtrain fit``'s checks of
where it writes. Each case here failed before: the victim file was written, removed or read.

The attack corpus (tests/test_attacks.py) tries every class of the threat model on every command as
real processes; these are the units and the in-process command runs behind it.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pbgio import confinement, storage
from pbgio.checkpoint import CheckpointDir
from pbgio.errors import RemoteRefusedError, UnsafeWriteError
from pbgio.example import build_example
from pbgio.storage import atomic
from pbgio.validate import validate_path
from tests.cli import pbgio, pbgtrain

VICTIM_TEXT = "ssh-ed25519 AAAAC3victim user@host\n"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example layout (small), trained for one epoch: a checkpoint with a version, config and stats."""
    root = tmp_path_factory.mktemp("trained") / "layout"
    config = build_example(root, num_edges=600)
    done = pbgtrain("fit", str(config), "-p", "num_epochs=1", "--no-progress", "--seed", "0")
    assert done.returncode == 0, done.stderr
    return root


@pytest.fixture
def layout(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained layout under ``tmp_path/layout``; ``tmp_path/victim`` is outside it."""
    root = tmp_path / "layout"
    shutil.copytree(trained, root, symlinks=True)
    (tmp_path / "victim").mkdir()
    return root


def _victim(layout: Path, name: str = "authorized_keys") -> Path:
    path = layout.parent / "victim" / name
    path.write_text(VICTIM_TEXT, encoding="utf-8")
    return path


def _edit(config: Path, **changes: object) -> None:
    data = json.loads(config.read_text())
    data.update(changes)
    config.write_text(json.dumps(data))


# --------------------------------------------------------------------------- the scope, as a unit


def test_outside_a_scope_nothing_is_checked_and_inside_only_admitted_roots(tmp_path: Path) -> None:
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    (inside / "link").symlink_to(outside / "secret")
    assert confinement.read_escape(inside / "link") is None  # a library call: the caller names its paths
    confinement.check_write(outside / "x", "file")
    with confinement.scope(follow_links=False, write_outside=False, allow_remote=""):
        confinement.admit(inside, write=True)
        assert confinement.read_escape(inside / "link") == str((outside / "secret").resolve())
        assert confinement.read_escape(inside / "file") is None
        confinement.check_write(inside / "a" / "b.h5", "file")  # below a root, made as needed
        with pytest.raises(UnsafeWriteError, match="lies outside the folders this command may write"):
            confinement.check_write(outside / "x", "file")
        (inside / "linked").symlink_to(outside)
        with pytest.raises(UnsafeWriteError, match=r"through the symbolic link .*linked"):
            confinement.check_write(inside / "linked" / "x", "file")
    with confinement.scope(follow_links=True, write_outside=True, allow_remote=""):  # the user's word
        assert confinement.read_escape(inside / "link") is None
        confinement.check_write(outside / "x", "file")


def test_urls_are_contacted_only_on_storage_the_command_line_named() -> None:
    with confinement.scope(follow_links=False, write_outside=False, allow_remote=""):
        assert confinement.url_refusal("http://evil.example/x") is not None
        confinement.admit("s3://KEY:SECRET@graphs/config.json")
        assert confinement.url_refusal("s3://graphs/edges") is None
        assert "s3://other" in (confinement.url_refusal("s3://other/edges") or "")
        with pytest.raises(RemoteRefusedError) as refused:
            storage.resolve("http://u:pw@evil.example/edges")
        assert "pw" not in str(refused.value) and "PBG_ALLOW_REMOTE" in str(refused.value)
    with confinement.scope(follow_links=False, write_outside=False, allow_remote="http://evil.example"):
        assert confinement.url_refusal("http://evil.example/x") is None
    with confinement.scope(follow_links=False, write_outside=False, allow_remote="*"):
        assert confinement.url_refusal("gs://any/x") is None


# --------------------------------------------------------------------------- writers, in or out of a scope


def test_an_atomic_write_replaces_a_shipped_link_and_never_writes_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    (tmp_path / "config.json").symlink_to(victim)
    (tmp_path / ".config.json.tmp").symlink_to(victim)  # a planted temporary name too
    atomic.write_text(tmp_path / "config.json", "{}")
    assert victim.read_text() == VICTIM_TEXT
    assert not (tmp_path / "config.json").is_symlink() and (tmp_path / "config.json").read_text() == "{}"


def test_the_lock_and_the_stats_refuse_a_link_or_a_fifo_even_from_a_library_call(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / ".pbg-lock").symlink_to(victim)
    with pytest.raises(UnsafeWriteError, match=r"\.pbg-lock: refused to write: the checkpoint lock file is a symbolic"):
        storage.CheckpointLock(ckpt).acquire()
    (ckpt / ".pbg-lock").unlink()
    os.mkfifo(ckpt / ".pbg-lock")
    with pytest.raises(UnsafeWriteError, match="found a FIFO"):
        storage.CheckpointLock(ckpt).acquire()
    (ckpt / "training_stats.json").symlink_to(tmp_path / "nowhere" / "created.json")
    with pytest.raises(UnsafeWriteError, match="training stats file is a symbolic link"):
        CheckpointDir(ckpt).append_stats([{"epoch_idx": 0}])
    assert victim.read_text() == VICTIM_TEXT and not (tmp_path / "nowhere").exists()


def test_kept_and_snapshot_directories_are_never_links(tmp_path: Path) -> None:
    other = tmp_path / "other-project"
    other.mkdir()
    (tmp_path / "best").symlink_to(other)
    with pytest.raises(UnsafeWriteError, match=r"best: refused to write: .* is a symbolic link"):
        atomic.real_dir(tmp_path / "best", "kept version's directory best/")
    atomic.real_dir(tmp_path / "epoch_1", "snapshot directory")
    assert (tmp_path / "epoch_1").is_dir() and not (tmp_path / "epoch_1").is_symlink()


# --------------------------------------------------------------------------- fit on a layout from someone else


def test_fit_refuses_a_shipped_lock_link_and_validate_reports_it(layout: Path) -> None:
    victim = _victim(layout)
    (layout / "checkpoint" / ".pbg-lock").symlink_to(victim)
    done = pbgtrain("fit", str(layout / "config.json"), "-p", "num_epochs=2", "--no-progress")
    assert done.returncode == 1 and "checkpoint lock file is a symbolic link" in done.stderr, done.stderr
    assert victim.read_text() == VICTIM_TEXT and (layout / "checkpoint" / ".pbg-lock").is_symlink()
    report = validate_path(layout / "config.json")
    assert "layout-link-outside" in report.rule_ids() and not report.ok


def test_fit_refuses_a_dangling_stats_link_and_creates_nothing(layout: Path) -> None:
    stats = layout / "checkpoint" / "training_stats.json"
    stats.unlink()
    target = layout.parent / "victim" / "created.json"
    stats.symlink_to(target)
    done = pbgtrain("fit", str(layout / "config.json"), "-p", "num_epochs=2", "--no-progress")
    assert done.returncode == 1, done.stderr
    assert "training stats file is a symbolic link" in done.stderr or "layout-link-outside" in done.stderr
    assert not target.exists()


def _another_project(tmp_path: Path, trained: Path) -> tuple[Path, dict[str, str]]:
    other = tmp_path / "victim" / "project"
    shutil.copytree(trained / "checkpoint", other)
    return other, {p.name: _digest(p) for p in other.iterdir() if p.is_file()}


@pytest.mark.parametrize("snapshot", ["best", "epoch_2"])
def test_fit_never_writes_or_deletes_through_a_kept_version_link(layout: Path, trained: Path, snapshot: str) -> None:
    other, before = _another_project(layout.parent, trained)
    (layout / "checkpoint" / snapshot).symlink_to(other)
    args = ["-p", "num_epochs=2"]
    if snapshot == "best":
        args += ["-p", "edge_paths=edges/train", "--valid", "edges/test", "--eval-every", "1"]
    else:
        args += ["-p", "checkpoint_preservation_interval=1"]
    done = pbgtrain("fit", str(layout / "config.json"), *args, "--no-progress")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert {p.name: _digest(p) for p in other.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("where", ["absolute", "up"])
def test_a_config_that_writes_outside_its_folder_needs_the_users_word(layout: Path, where: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    outside = layout.parent / "victim" / "model"
    _edit(layout / "config.json",
          checkpoint_path=str(outside) if where == "absolute" else "../victim/model")
    done = pbgtrain("fit", str(layout / "config.json"), "-p", "num_epochs=1", "--no-progress")
    assert done.returncode == 1 and "lies outside the folders this command may write" in done.stderr, done.stderr
    assert not outside.exists()
    report = validate_path(layout / "config.json")
    assert "layout-path-outside" in report.rule_ids()  # a warning: read as named, written only on the user's word
    named = pbgtrain("fit", str(layout / "config.json"), "-p", "num_epochs=1", "-p", f"checkpoint_path={outside}",
                     "--no-progress")
    assert named.returncode == 0, named.stderr  # named on the command line: the user's own choice
    assert (outside / "checkpoint_version.txt").is_file()
    shutil.rmtree(outside)
    monkeypatch.setenv(confinement.WRITE_OUTSIDE_ENV, "1")
    trusted = pbgtrain("fit", str(layout / "config.json"), "-p", "num_epochs=1", "--no-progress")
    assert trusted.returncode == 0, trusted.stderr


def test_a_checkpoint_path_linked_out_of_the_layout_is_never_written(layout: Path, trained: Path) -> None:
    other, before = _another_project(layout.parent, trained)
    shutil.rmtree(layout / "checkpoint")
    (layout / "checkpoint").symlink_to(other)
    done = pbgtrain("fit", str(layout / "config.json"), "-p", "num_epochs=2", "--no-progress")
    assert done.returncode == 1, done.stderr
    assert {p.name: _digest(p) for p in other.iterdir() if p.is_file()} == before
    assert "layout-link-outside" in validate_path(layout / "config.json").rule_ids()


def test_fit_writes_no_file_into_a_directory_of_other_files(layout: Path) -> None:
    mine = layout.parent / "victim" / "photos"
    mine.mkdir()
    (mine / "holiday.jpg").write_bytes(b"\xff\xd8")
    done = pbgtrain("fit", str(layout / "config.json"), "-p", f"checkpoint_path={mine}", "--no-progress")
    assert done.returncode == 2 and "a directory of other files (holiday.jpg), not a pbg checkpoint" in done.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["holiday.jpg"]


# --------------------------------------------------------------------------- reads and URLs


def test_a_names_file_linked_out_of_the_layout_is_not_exported_unless_links_may_be_followed(
        layout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = layout.parent / "victim" / "secret.json"
    count = int((layout / "entities" / "entity_count_item_0.txt").read_text())
    secret.write_text(json.dumps([f"SECRET-{i}" for i in range(count)]))
    names = layout / "entities" / "entity_names_item_0.json"
    names.unlink()
    names.symlink_to(secret)
    out = layout.parent / "out.tsv"
    done = pbgio("export", str(layout / "config.json"), "-o", str(out))
    assert done.returncode == 1 and "layout-link-outside" in done.stderr, done.stderr
    assert not out.exists() and "SECRET" not in done.stdout + done.stderr
    monkeypatch.setenv(confinement.FOLLOW_LINKS_ENV, "1")
    assert pbgio("export", str(layout / "config.json"), "-o", str(out)).returncode == 0
    assert "SECRET-3" in out.read_text()


def test_a_config_linked_from_elsewhere_is_refused(layout: Path, tmp_path: Path) -> None:
    shipped = tmp_path / "download"
    shipped.mkdir()
    (shipped / "config.json").symlink_to(layout / "config.json")  # the victim's project, by its config
    done = pbgtrain("fit", str(shipped / "config.json"), "--no-progress")
    assert done.returncode == 1 and "layout-link-outside" in done.stderr, done.stderr


@pytest.fixture
def listening() -> Iterator[list[str]]:
    """A web server on 127.0.0.1 that records every request it receives."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _record(self) -> None:
            seen.append(f"{self.command} {self.path}")
            self.send_response(404)
            self.end_headers()

        do_GET = do_HEAD = do_POST = do_PUT = _record

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    seen.append(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield seen
    finally:
        server.shutdown()


def test_a_url_the_layout_names_is_never_contacted(layout: Path, listening: list[str]) -> None:
    url = listening.pop(0)
    _edit(layout / "config.json", edge_paths=[f"{url}/edges/train"], checkpoint_path=f"{url}/model")
    report = pbgio("validate", str(layout / "config.json"), "--json")
    assert report.returncode == 1 and "layout-url-refused" in report.stdout, report.stdout + report.stderr
    done = pbgtrain("fit", str(layout / "config.json"), "--no-progress")
    assert done.returncode == 2 and "refused to contact" in done.stderr, done.stderr
    for command in (["info"], ["export", "-o", str(layout.parent / "x.tsv")]):
        assert pbgio(command[0], str(layout / "config.json"), *command[1:]).returncode in (1, 2)
    assert listening == []  # not one request reached the host the layout named


def test_a_scope_confines_its_own_thread_and_the_work_it_hands_on_not_the_programs_other_threads(
        tmp_path: Path) -> None:
    """A command run in one thread (the CLI in-process, ``validate_path``) must not refuse another
    thread's library call its own paths (tests/test_concurrency.py's export beside a fit); a read
    ahead the command hands to a thread of its own stays confined (``confinement.inherited``)."""
    inside, outside = tmp_path / "layout", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    results: dict[str, str] = {}

    def write_outside() -> None:
        try:
            confinement.check_write(outside / "out.tsv", "the export")
            results[threading.current_thread().name] = "written"
        except UnsafeWriteError:
            results[threading.current_thread().name] = "refused"

    with confinement.scope(follow_links=False, write_outside=False, allow_remote=""):
        confinement.admit(inside, write=True)
        library = threading.Thread(target=write_outside, name="library")
        read_ahead = threading.Thread(target=confinement.inherited(write_outside), name="read-ahead")
        for thread in (library, read_ahead):
            thread.start()
            thread.join()
        write_outside()
    assert results == {"library": "written", "read-ahead": "refused", "MainThread": "refused"}
