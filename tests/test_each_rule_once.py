"""Rules that once had two implementations keep one: a source-level guard per rule (issue 48), so a
copy that comes back fails here with the module that holds it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pbgio", "pbgtrain")


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            yield str(path.relative_to(REPO)), ast.parse(path.read_text(), filename=str(path))


def _called(tree: ast.Module) -> set[str]:
    """Names of the functions and methods a module calls."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                names.add(func.id)
            elif isinstance(func, ast.Attribute):
                names.add(func.attr)
    return names


def test_the_parameters_a_config_implies_are_listed_once() -> None:
    """The names and shapes of a model's parameters (operator parameters per relation and side,
    global embeddings) come from ``pbgio.spec.checkpoint.expected_model_params`` alone; the testing
    layouts (``expected_params``) and every reader ask it instead of walking the relations again."""
    builders = [name for name, tree in _modules()
                if {"param_shapes", "operator_param_name"} <= _called(tree)]
    assert builders == ["pbgio/spec/checkpoint.py"]


def _resolves_with_storage(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "resolve"
               and isinstance(node.func.value, ast.Name) and node.func.value.id == "storage"
               for node in ast.walk(tree))


def test_pbgtrain_resolves_layout_paths_only_through_the_layout() -> None:
    """A path of the layout named by a user (``--edges``, ``--filter``, ``--valid``, the library's
    ``filter_paths``) goes through ``Layout.argument_path`` (relative to the config's folder);
    ``storage.resolve`` against the current directory is left to what is the user's own: the
    ``--base`` folder and output files (``cli``) and an input file of queries (``predict.inputs``)."""
    cwd_relative = [name for name, tree in _modules() if name.startswith("pbgtrain/") and _resolves_with_storage(tree)]
    assert cwd_relative == ["pbgtrain/cli.py", "pbgtrain/predict/inputs.py"]
