"""Hostile pickles are refused and never run; --trust-pickle is the only way past the allow-list.

Every hostile file here is built by the test itself. Its payload would create a marker
file when unpickled; the tests prove the marker never appears.
"""

from __future__ import annotations

import builtins
import io
import operator
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from pbgio.errors import FormatError, UnsafePickleError
from pbgio.legacy.migrate import migrate, plan_migration
from pbgio.legacy.pickles import ALLOWED_GLOBALS, _torch_refused_global, inspect_pickle, load_pickle
from pbgio.testing.legacy_layouts import LegacySpec, write_legacy_layout
from tests.shared import SAMPLES

CONVERT = (
    "import sys\n"
    "from pbgio.cli.commands import app\n"
    "from pbgio.cli.converting import convert\n"
    "if not any(c.callback is convert for c in app.registered_commands):\n"
    "    app.command()(convert)\n"
    "app(['convert', *sys.argv[1:]])\n"
)


def run_convert(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CONVERT, *args], capture_output=True, text=True, check=False)


class SystemPayload:
    """Unpickling this runs ``touch marker`` through os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


class ExecPayload:
    """Unpickling this runs Python code through builtins.exec."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",))


class HarmlessPayload:
    """Refused (operator.add is not allow-listed) but harmless: unpickles to ``value``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> Any:
        return (operator.add, (self.value - 1, 1))


def write(obj: Any, path: Path, container: str) -> None:
    if container == "pickle":
        path.write_bytes(pickle.dumps(obj, protocol=4))
    else:
        torch.save(obj, path, _use_new_zipfile_serialization=container == "zip")


PAYLOADS = {"os.system": (SystemPayload, ("posix.system", "nt.system", "os.system")),
            "builtins.exec": (ExecPayload, ("builtins.exec",))}
CONTAINERS = ("zip", "legacy", "pickle")


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_loader_refuses_and_never_runs(payload: str, container: str, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    cls, names = PAYLOADS[payload]
    path = tmp_path / "METADATA_1.pt"
    write(cls(marker), path, container)
    assert inspect_pickle(path).container == container
    with pytest.raises(UnsafePickleError) as info:
        load_pickle(path)
    assert info.value.global_name in names
    assert info.value.file == str(path)
    message = str(info.value)
    assert str(path) in message and info.value.global_name in message and "--trust-pickle" in message
    assert info.value.rule == "legacy-unsafe-pickle"
    assert not marker.exists()


@pytest.mark.parametrize("container", CONTAINERS)
def test_payload_hidden_inside_a_genuine_structure(container: str, tmp_path: Path) -> None:
    """A METADATA-shaped tuple with one poisoned value is refused as a whole."""
    marker = tmp_path / "PWNED"
    path = tmp_path / "METADATA_1.pt"
    write(({"dimension": 4}, 0, 0, {"global_embs.emb_x": torch.zeros(4)}, ExecPayload(marker)), path,
          container if container != "pickle" else "zip")
    with pytest.raises(UnsafePickleError, match=r"builtins\.exec"):
        load_pickle(path)
    assert not marker.exists()


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    root = tmp_path / "legacy"
    write_legacy_layout(root, LegacySpec(seed=5))
    return root


POISONED = {
    "metadata": "checkpoint/METADATA_1.pt.1",
    "embeddings": "checkpoint/user_1.pt.1",
    "count": "data/entities/entity_count_item_1.pt",
    "dictionary": "data/entities/dict.pt",
}


@pytest.mark.parametrize("which", sorted(POISONED))
def test_migration_refuses_a_poisoned_file(which: str, legacy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    poisoned = legacy / POISONED[which]
    write(SystemPayload(marker), poisoned, "legacy")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UnsafePickleError) as info:
        migrate(legacy, tmp_path / "out")
    assert info.value.file == str(poisoned)
    assert info.value.global_name in ("posix.system", "nt.system")
    assert not marker.exists()
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no staging directory left either
    with pytest.raises(UnsafePickleError):  # a dry run checks too
        migrate(legacy, tmp_path / "out", dry_run=True)
    assert not marker.exists()


def test_cli_refuses_with_exit_one_naming_file_and_global(legacy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    poisoned = legacy / POISONED["metadata"]
    write(ExecPayload(marker), poisoned, "zip")
    done = run_convert("--from", "legacy", str(legacy), str(tmp_path / "out"))
    assert done.returncode == 1, done.stderr
    assert "builtins.exec" in done.stderr and "METADATA_1.pt.1" in done.stderr
    assert "--trust-pickle" in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_trust_pickle_is_the_only_way_past(legacy: Path, tmp_path: Path) -> None:
    """With a harmless non-allow-listed global: refused by default, loaded with trust."""
    count = legacy / POISONED["count"]
    genuine = load_pickle(count)
    write(HarmlessPayload(genuine), count, "legacy")
    with pytest.raises(UnsafePickleError, match=r"_operator\.add"):
        load_pickle(count)
    assert load_pickle(count, trust=True) == genuine
    with pytest.raises(UnsafePickleError):
        migrate(legacy, tmp_path / "refused")
    done = run_convert("--from", "legacy", str(legacy), str(tmp_path / "cli"), "--trust-pickle")
    assert done.returncode == 0, done.stderr
    assert "--trust-pickle" in done.stderr  # the warning
    assert (tmp_path / "cli" / "data" / "entities" / "entity_count_item_0.txt").read_text() == f"{genuine}\n"


def test_bare_and_protocol_variants_of_genuine_data_load(tmp_path: Path) -> None:
    path = tmp_path / "entity_count_user_1.pt"
    path.write_bytes(pickle.dumps(13, protocol=2))
    assert load_pickle(path) == 13
    path.write_bytes(pickle.dumps(({"user": {"ix_to_word": {0: "a"}}}, None), protocol=4))
    assert load_pickle(path)[0]["user"]["ix_to_word"] == {0: "a"}
    torch.save((torch.ones(2), None), path, _use_new_zipfile_serialization=False, pickle_protocol=4)
    assert inspect_pickle(path).container == "legacy"
    with pytest.warns(UserWarning, match="protocol 4"), pytest.raises(UnsafePickleError) as info:
        load_pickle(path)  # torch's restricted unpickler reads only protocol 2 in this container
    assert info.value.global_name is None and "Unsupported operand" in str(info.value)
    assert torch.equal(load_pickle(path, trust=True)[0], torch.ones(2))


def test_bare_pickle_of_a_tensor_is_refused(tmp_path: Path) -> None:
    """pickle.dumps(tensor) rebuilds its storage through torch.load itself: not allowed."""
    path = tmp_path / "user_1.pt"
    path.write_bytes(pickle.dumps(torch.ones(3)))
    with pytest.raises(UnsafePickleError):
        load_pickle(path)


def test_not_a_pickle(tmp_path: Path) -> None:
    path = tmp_path / "METADATA_1.pt"
    path.write_bytes(b"\x89HDF\r\n\x1a\n not a pickle")
    with pytest.raises(FormatError, match="legacy-pickle-unreadable"):
        load_pickle(path)
    truncated = tmp_path / "user_1.pt"
    torch.save((torch.ones(100), None), truncated, _use_new_zipfile_serialization=False)
    truncated.write_bytes(truncated.read_bytes()[:60])
    with pytest.raises(FormatError) as info:
        load_pickle(truncated)
    assert not isinstance(info.value, UnsafePickleError)


def test_samples_need_only_the_allow_list() -> None:
    files = sorted(SAMPLES.glob("sample_legacy_*/**/*.pt*"))
    assert len(files) >= 10, SAMPLES
    seen: set[str] = set()
    for path in files:
        info = inspect_pickle(path)
        assert not info.refused(), path
        seen |= set(info.globals)
    assert seen <= ALLOWED_GLOBALS
    assert {"torch._utils._rebuild_parameter", "torch._utils._rebuild_tensor_v2"} <= seen


def test_torch_refusal_messages_are_parsed() -> None:
    message = ("Weights only load failed.\n\nTrying to load unsupported GLOBAL posix.system whose module "
               "posix is blocked.")
    assert _torch_refused_global(message, ["posix.system"]) == "posix.system"
    message = "WeightsUnpickler error: Unsupported global: GLOBAL exec was not an allowed global by default."
    assert _torch_refused_global(message, ["builtins.exec"]) == "builtins.exec"
    assert _torch_refused_global("Unsupported operand 149", []) is None


def test_plan_checks_every_pickle_even_in_a_dry_run(legacy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    shutil.copy(legacy / POISONED["embeddings"], tmp_path / "backup")
    write(SystemPayload(marker), legacy / POISONED["embeddings"], "zip")
    with pytest.raises(UnsafePickleError):
        plan_migration(legacy)
    assert not marker.exists()
    buffer = io.BytesIO()
    torch.save(1, buffer)
    assert buffer.getvalue()  # sanity: torch itself still works after the refusals
