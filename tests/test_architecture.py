"""The shape of the code: no import cycles, every module in a declared layer, no long module
without a stated reason.

The layer contracts themselves are in ``pyproject.toml`` (``[tool.importlinter]``) and are
checked by ``lint-imports`` (a step of ``.ci/run``); :func:`test_import_contracts_hold` runs the
same check here, so the fast suite catches a broken layer too. The import graph is built by
grimp (import-linter's engine): it counts every import, those under ``TYPE_CHECKING`` and inside
functions included, so neither hides a cycle.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="needs grimp (pip install -e '.[lint]': import-linter)")
tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with tomllib (Python 3.11+)")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pbgio", "pbgtrain")
LONG_MODULE_LINES = 500
LONG_MODULE_REASON = "Why this module is long:"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def strongly_connected(nodes: Iterable[str], edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The groups of more than one node that reach each other (Tarjan's algorithm, iterative).

    >>> strongly_connected("abcd", {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": set()})
    [['a', 'b']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_import_cycles(graph: grimp.ImportGraph) -> None:
    """No module of pbgio or pbgtrain reaches itself through its imports."""
    modules = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in modules}
    assert strongly_connected(modules, edges) == []


def test_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a three-module loop is found, a chain is not."""
    assert strongly_connected("xyz", {"x": {"y"}, "y": {"z"}, "z": {"x"}}) == [["x", "y", "z"]]
    assert strongly_connected("xyz", {"x": {"y"}, "y": {"z"}}) == []


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(config["tool"]["importlinter"]["contracts"])


def _layer_modules(contract: Mapping[str, object]) -> set[str]:
    layers = contract["layers"]
    assert isinstance(layers, list)
    return {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}


@pytest.mark.parametrize(("package", "contract"), [("pbgio", "pbgio-layers"), ("pbgtrain", "pbgtrain-layers")])
def test_every_module_is_in_a_layer(graph: grimp.ImportGraph, package: str, contract: str) -> None:
    """Every module of the package is placed in a layer (it, or a package above it, is named by
    the contract), so the layers cover all of it, not only the modules that existed when they
    were written. Package ``__init__`` modules whose children are placed one by one, and
    ``__main__``, are exempt."""
    (layers,) = [c for c in _contracts() if c["id"] == contract]
    declared = _layer_modules(layers)
    packages = {m for m in graph.modules if graph.find_children(m)}
    unplaced = []
    for module in sorted(m for m in graph.modules if m.startswith(f"{package}.")):
        parts = module.split(".")
        if parts[-1] == "__main__" or (module in packages and module not in declared):
            continue
        if not any(".".join(parts[:i]) in declared for i in range(2, len(parts) + 1)):
            unplaced.append(module)
    assert unplaced == []


def test_import_contracts_hold() -> None:
    """``lint-imports``: the layers of pbgio, and pbgtrain using only pbgio's public API."""
    from importlinter.cli import EXIT_STATUS_SUCCESS, lint_imports

    sys.path.insert(0, str(ROOT))
    try:
        status = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    finally:
        sys.path.remove(str(ROOT))
    assert status == EXIT_STATUS_SUCCESS, "import contracts broken (the report is above)"


def _python_modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_long_modules_say_why() -> None:
    """A module over 500 lines states why in its docstring (a sentence starting
    'Why this module is long:'); all others are short enough to read in one sitting."""
    unexplained = []
    for path in _python_modules():
        source = path.read_text()
        if source.count("\n") <= LONG_MODULE_LINES:
            continue
        docstring = ast.get_docstring(ast.parse(source)) or ""
        if LONG_MODULE_REASON not in docstring:
            unexplained.append(f"{path.relative_to(ROOT)}: {source.count(chr(10))} lines")
    assert unexplained == []


MAX_MODULE_LINES = 600
CATALOGUES = ROOT / "pbgio" / "testing"
"""The testing catalogues (every mutator, every fuzz target) may run longer, saying why."""


def test_no_module_over_600_lines() -> None:
    """Past 600 lines a module holds more than one job; only the testing catalogues may, with their
    reason stated (:func:`test_long_modules_say_why`)."""
    over = [f"{p.relative_to(ROOT)}: {p.read_text().count(chr(10))} lines" for p in _python_modules()
            if p.read_text().count("\n") > MAX_MODULE_LINES and not p.is_relative_to(CATALOGUES)]
    assert over == []


def _class(module: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(module.read_text())
    (found,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    return found


def test_the_coordinator_seam_is_narrow() -> None:
    """``Coordinator``: where a process sits (one frozen ``Placement``) and a few verbs, no more."""
    seam = _class(ROOT / "pbgtrain" / "training" / "coordinator.py", "Coordinator")
    members = [n.name for n in seam.body if isinstance(n, ast.FunctionDef)]
    assert len(members) <= 8, members
    placement = _class(ROOT / "pbgtrain" / "training" / "coordinator.py", "Placement")
    assert any(isinstance(d, ast.Call) and "frozen" in ast.unparse(d) for d in placement.decorator_list)


def test_the_trainer_stays_short() -> None:
    """Partitions (``PartitionStore``), edges (``EdgeChunks``) and held-out ranking live beside it."""
    trainer = _class(ROOT / "pbgtrain" / "training" / "trainer.py", "Trainer")
    assert trainer.end_lineno is not None and trainer.end_lineno - trainer.lineno < 250
