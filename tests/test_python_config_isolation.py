"""A Python config runs isolated, and only when the user names it (issue 54).

The original's ``config.py`` is code: loading one runs it in a child Python. That child must run the
config the user trusts and nothing else: no module of the current directory (a downloaded layout the
user ``cd``-ed into holds an attacker's ``json.py``), nothing ``PYTHONPATH`` or ``PYTHONSTARTUP`` names.
Each attacker module here creates a marker file when it runs; the tests prove the marker never appears.
A command says first that it runs a config, and never runs one it finds inside a layout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pbgio.errors import Notice
from pbgio.python_config import run_python_config
from tests.cli import pbgio

pytestmark = pytest.mark.filterwarnings("ignore::pbgio.errors.Notice")

CONFIG = '''
import os

def get_torchbiggraph_config():
    return dict(entities={"user": {"num_partitions": 1}},
                relations=[{"name": "follows", "lhs": "user", "rhs": "user"}],
                dimension=16, entity_path="data", edge_paths=["data/train"], checkpoint_path="model",
                init_path=os.getcwd())
'''

SHADOWED = ("json", "enum", "types", "traceback", "linecache", "tokenize", "os", "tempfile")
"""Modules an attacker's folder shadows: what the runner imports, and more."""


SHADOW = """\
import sys as _sys
open({marker!r}, "a").write({name!r})
_saved = _sys.path[:]
_sys.path[:] = [p for p in _sys.path if p not in ("", {folder!r})]
del _sys.modules[{name!r}]
_real = __import__({name!r})
_sys.path[:] = _saved
_sys.modules[{name!r}] = _real
"""
"""An attacker's module: it writes the marker, then hands over the real module (so nothing else breaks)."""


def _attacker(folder: Path, marker: Path) -> Path:
    """A folder of attacker modules that each create ``marker`` when imported."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in SHADOWED:
        (folder / f"{name}.py").write_text(SHADOW.format(marker=str(marker), name=name, folder=str(folder)))
    (folder / "startup.py").write_text(f"open({str(marker)!r}, 'a').write('startup')\n")
    return folder


def _trusted(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.py").write_text(CONFIG)
    return folder / "config.py"


def test_modules_of_the_current_directory_never_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "pwned"
    config = _trusted(tmp_path / "configs")
    monkeypatch.chdir(_attacker(tmp_path / "downloaded", marker))
    raw = run_python_config(config, echo=None)
    assert not marker.exists(), marker.read_text()
    assert raw["init_path"] == str(tmp_path / "downloaded")  # the current directory is unchanged for the config


def test_python_environment_variables_are_not_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "pwned"
    attacker = _attacker(tmp_path / "attacker", marker)
    monkeypatch.setenv("PYTHONPATH", str(attacker))
    monkeypatch.setenv("PYTHONSTARTUP", str(attacker / "startup.py"))
    monkeypatch.setenv("PYTHONINSPECT", "1")
    raw = run_python_config(_trusted(tmp_path / "configs"), echo=None)
    assert raw["dimension"] == 16
    assert not marker.exists(), marker.read_text()


def test_the_configs_own_folder_comes_first_for_its_imports(tmp_path: Path) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "shared_settings.py").write_text("DIMENSION = 48\n")
    (folder / "config.py").write_text(CONFIG.replace("dimension=16", "dimension=shared_settings.DIMENSION")
                                      .replace("import os", "import os\nimport shared_settings"))
    assert run_python_config(folder / "config.py", echo=None)["dimension"] == 48


def test_running_a_config_is_said_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _trusted(tmp_path / "configs")
    with pytest.warns(Notice, match=r"running the Python config .*config\.py: its code runs with your permissions"):
        run_python_config(config, echo=None)
    monkeypatch.chdir(tmp_path)
    for command in (("info", "configs/config.py"), ("config", "from-py", "configs/config.py", "-o", "-")):
        done = pbgio(*command)
        assert done.returncode == 0, done.stderr
        assert done.stderr.splitlines()[0] == ("note: running the Python config configs/config.py: its code runs "
                                               "with your permissions")


def test_a_config_py_inside_a_layout_is_never_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a config named on the command line runs: a ``config.py`` that a project folder, a checkpoint
    or a legacy SRC holds is data (these commands never ran one; this keeps it so)."""
    from pbgio.testing.legacy_layouts import LegacySpec, write_legacy_layout

    marker = tmp_path / "pwned"
    payload = f"open({str(marker)!r}, 'w').close()\ndef get_torchbiggraph_config():\n    return {{}}\n"
    project = tmp_path / "project"
    (project / "model").mkdir(parents=True)
    for folder in (project, project / "model"):
        (folder / "config.py").write_text(payload)
    legacy = tmp_path / "legacy"
    write_legacy_layout(legacy, LegacySpec(seed=5))
    (legacy / "config.py").write_text(payload)
    monkeypatch.chdir(tmp_path)
    pbgio("info", str(project))
    pbgio("validate", str(project))
    pbgio("validate", str(project / "model"))
    converted = pbgio("convert", "--from", "legacy", str(legacy), str(tmp_path / "out"))
    assert converted.returncode == 0, converted.stderr
    assert not marker.exists()
    assert "running the Python config" not in converted.stderr
    assert not (tmp_path / "out" / "config.py").exists()
