"""The retry policy of remote storage (pbgio.storage.retry) and storage faults on an ``s3://``
layout: faults injected into s3fs's requests (pbgio.testing.storage_faults) against moto's S3
server. The campaign over import, fit, export and index build is tools/remote_faults.py; a short
run of it is the slow test at the end."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from pbgio import storage
from pbgio.storage import retry
from pbgio.storage.retry import Policy, is_transient

ROOT = Path(__file__).resolve().parents[1]


class Flaky:
    """Fails its first ``failures`` calls with ``error``, then answers ``"ok"``."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def test_transient_failures_are_tried_again_at_most_the_policy_s_attempts() -> None:
    policy = Policy(attempts=3, base_delay=0.0)
    twice = Flaky(2, ConnectionResetError("connection reset by peer"))
    assert policy.call(twice) == "ok" and twice.calls == 3
    always = Flaky(10, TimeoutError("read timed out"))
    with pytest.raises(TimeoutError):
        policy.call(always)
    assert always.calls == 3


@pytest.mark.parametrize("error", [FileNotFoundError("s3://b/k"), PermissionError("denied"),
                                   storage.StorageError("s3://b/k", "bad"), ValueError("a bug")])
def test_permanent_failures_are_not_tried_again(error: Exception) -> None:
    once = Flaky(1, error)
    with pytest.raises(type(error)):
        Policy(attempts=3, base_delay=0.0).call(once)
    assert once.calls == 1 and not is_transient(error)


def test_an_attempt_that_ran_a_whole_timeout_is_not_tried_again_and_delays_double_up_to_a_cap() -> None:
    slow = Flaky(1, TimeoutError("read timed out"))
    with pytest.raises(TimeoutError):
        Policy(attempts=3, base_delay=0.0, attempt_timeout=0.0).call(slow)
    assert slow.calls == 1
    assert [Policy(base_delay=0.1, max_delay=0.3).delay(n) for n in (1, 2, 3)] == [0.1, 0.2, 0.3]


def test_policy_reads_its_attempts_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(retry.RETRIES_ENV, "5")
    monkeypatch.setenv(storage.TIMEOUT_ENV, "7")
    assert retry.policy() == Policy(attempts=5, attempt_timeout=7.0)


# ---------------------------------------------------------------------- faults on a real S3 server


def _server_env_restored_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables an S3Server sets in this process are put back as they were after the test."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                 "AWS_EC2_METADATA_DISABLED", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "-")  # remembers the value (or its absence) to restore
        monkeypatch.delenv(name)
    monkeypatch.setenv(retry.RETRIES_ENV, "3")
    monkeypatch.setenv(storage.TIMEOUT_ENV, "20")


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from pbgio.testing.s3server import S3Server

    _server_env_restored_after(monkeypatch)
    with S3Server(bucket=f"pbg-{uuid.uuid4().hex[:8]}") as server:
        yield server.url("graph")


def test_s3_requests_failing_fewer_times_than_the_attempts_are_retried(s3: str) -> None:
    from pbgio.testing.storage_faults import Plan, inject

    target = storage.resolve(f"{s3}/names.json")
    with inject(Plan(at=0, burst=2, kind="error")) as plan:
        storage.write_text(target, "[1, 2]")  # the upload's first request fails twice
    assert plan.injected == 2
    with inject(Plan(at=0, burst=2, kind="timeout")):
        assert target.read_text() == "[1, 2]"


def test_s3_request_failing_past_the_attempts_names_the_url_and_the_operation(s3: str) -> None:
    from pbgio.testing.storage_faults import Plan, inject

    target = storage.resolve(f"{s3}/names.json")
    storage.write_text(target, "[1]")
    with inject(Plan(at=0, burst=3, kind="error")), pytest.raises(storage.StorageError) as failed:
        storage.write_text(target, "[1, 2, 3]")
    message = str(failed.value)
    assert f"{s3}/names.json: upload: ConnectionResetError" in message, message
    assert target.read_text() == "[1]"  # the object before the failed write, unchanged


# ---------------------------------------------------------------------------------- the campaign


def _campaign_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("remote_faults", ROOT / "tools" / "remote_faults.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["remote_faults"] = module
    spec.loader.exec_module(module)
    return module


def test_campaign_finds_a_damaged_committed_state() -> None:
    """The campaign's check fails on what it must catch: a committed file that changed, a commit
    that is neither the state before nor a fault-free run's; it accepts leftovers."""
    damage = _campaign_tool()._committed_damage
    before = {"model/checkpoint_version.txt": "v1", "model/embeddings_node_0.v1.h5": "a"}
    done = {"model/checkpoint_version.txt": "v2", "model/embeddings_node_0.v2.h5": "b"}
    assert damage(before, before, done, 1) is None
    assert damage({**done, "model/embeddings_node_0.v1.h5": "a"}, before, done, 0) is None  # not yet removed
    assert damage({**before, "model/embeddings_node_0.v2.h5": "half"}, before, done, 1) is None  # uncommitted
    assert "differ" in damage({**before, "model/embeddings_node_0.v1.h5": "x"}, before, done, 1)
    assert "differ" in damage({**done, "model/embeddings_node_0.v2.h5": "x"}, before, done, 0)
    assert "neither" in damage({"model/checkpoint_version.txt": "v3"}, before, done, 1)


@pytest.mark.slow  # about 2 minutes: 24 commands with faults on the S3 server
def test_remote_fault_campaign_loses_nothing(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    _server_env_restored_after(monkeypatch)
    assert _campaign_tool().main(["--faults", "24", "--seed", "3"]) == 0
    summary = capsys.readouterr().out
    total = next(line for line in summary.splitlines() if line.startswith("total")).split()
    assert int(total[1]) == 24 and int(total[-1]) == 0 and int(total[-2]) == 0, summary


def test_a_store_failing_an_existence_check_is_an_error_not_a_missing_file(s3: str) -> None:
    """fsspec's ``isfile`` answers False to any exception: a validation would report a committed
    file as missing when the store failed to answer (found by tools/remote_faults.py)."""
    from pbgio.testing.storage_faults import Plan, inject

    target = storage.resolve(f"{s3}/model.v1.h5")
    storage.write_bytes(target, b"x")
    with inject(Plan(at=0, burst=3)), pytest.raises(storage.StorageError, match=r"model\.v1\.h5: stat"):
        target.is_file()
    assert target.is_file() and not storage.resolve(f"{s3}/model.v2.h5").is_file()
