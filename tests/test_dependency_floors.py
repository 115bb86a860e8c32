"""The floors that ``.ci/floors`` installs are the ones pyproject.toml declares: constraints/floors.txt
pins every direct dependency of ``pip install '.[test]'`` (the runtime ones, the extras the test
extra pulls in, the test tools) to its ``>=`` bound exactly, and pins nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with tomllib (Python 3.11+)")

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ROOT / "constraints" / "floors.txt"
SELF = "pbg"


def _declared() -> dict[str, Requirement]:
    """The direct requirements of ``.[test]``: the dependencies, and the extras the test extra
    names (``pbg[remote]`` …) with its own tools."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    lines, pending, seen = list(project["dependencies"]), ["test"], set()
    while pending:
        extra = pending.pop()
        seen.add(extra)
        for line in extras[extra]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == SELF:
                pending.extend(e for e in requirement.extras if e not in seen)
            else:
                lines.append(line)
    declared = {canonicalize_name(r.name): r for r in map(Requirement, lines)}
    assert len(declared) == len(lines), "a dependency is declared twice"
    return declared


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in FLOORS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and name.strip() and version.strip(), f"constraints/floors.txt: not NAME==VERSION: {line!r}"
        key = canonicalize_name(name.strip())
        assert key not in pins, f"constraints/floors.txt pins {key} twice"
        pins[key] = Version(version.strip())
    return pins


def test_every_declared_floor_is_pinned_exactly() -> None:
    pins = _pins()
    for name, requirement in _declared().items():
        floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert len(floors) == 1, f"{requirement}: declare one floor (>=) that .ci/floors can install"
        assert name in pins, f"{requirement}: constraints/floors.txt does not pin {name}=={floors[0]}"
        assert pins[name] == floors[0], (
            f"{requirement}: constraints/floors.txt pins {name}=={pins[name]}; "
            f"pin the declared floor {floors[0]}, or raise the floor to it"
        )


def test_the_floors_file_pins_nothing_undeclared() -> None:
    extra = sorted(set(_pins()) - set(_declared()))
    assert not extra, f"constraints/floors.txt pins packages pyproject.toml does not declare for .[test]: {extra}"


def test_the_floors_cover_the_dependencies_and_the_tested_extras() -> None:
    declared = _declared()
    assert {"torch", "numpy", "polars", "pytest"} <= set(declared)  # runtime and test tools
    assert {"fsspec", "matplotlib", "faiss-cpu"} <= set(declared)  # remote, report, ann through test
