"""The validator's rules once (issue 48, points 2 and 3): "checkpoint_path is a directory or
nothing" is coded in one predicate (:func:`pbgio.checks.layout.checkpoint_path_occupied`) that the
validator and ``pbgtrain fit`` both call; the validator asks the :class:`~pbgio.layout.Layout` for
every path of the config and reads and parses the config's JSON once. A copy that comes back
fails here."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pbgio.checks.layout import checkpoint_path_occupied
from pbgio.example import build_example
from pbgio.layout import Layout
from pbgio.validate import validate_layout, validate_path

REPO = Path(__file__).resolve().parents[1]
VALIDATOR = REPO / "pbgio" / "validate" / "__init__.py"
CHECKPOINT_PATH_RULE = "(or nothing, before training)"
CONFIG_PATHS = {"entity_path", "edge_paths", "checkpoint_path", "init_path"}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for package in ("pbgio", "pbgtrain"):
        for path in sorted((REPO / package).rglob("*.py")):
            yield str(path.relative_to(REPO)), ast.parse(path.read_text(), filename=str(path))


def _strings(tree: ast.Module) -> Iterator[str]:
    """Every string constant of a module, the literal parts of f-strings included (Python joins
    the pieces of an implicit concatenation into one)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def _calls(tree: ast.Module, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)]


@pytest.fixture
def example(tmp_path: Path) -> Path:
    return build_example(tmp_path / "example", num_edges=200)


# ---- point 2: checkpoint_path is a directory or nothing


def test_the_checkpoint_path_message_is_worded_in_one_module() -> None:
    holders = [name for name, tree in _modules() if any(CHECKPOINT_PATH_RULE in s for s in _strings(tree))]
    assert holders == ["pbgio/checks/layout.py"]


def test_the_validator_and_fit_ask_the_one_predicate() -> None:
    callers = [name for name, tree in _modules() if _calls(tree, "checkpoint_path_occupied")]
    assert callers == ["pbgio/validate/__init__.py", "pbgtrain/train.py"]


def test_the_predicate_words_the_issue() -> None:
    assert checkpoint_path_occupied("ckpt", None) is None  # a remote store: nobody can tell
    assert checkpoint_path_occupied("ckpt", "nothing") is None
    assert checkpoint_path_occupied("ckpt", "a directory") is None
    issue = checkpoint_path_occupied("ckpt", "a symbolic link loop", "checkpoint_path")
    assert issue is not None
    assert (issue.rule, issue.severity, issue.file, issue.dataset, issue.message) == (
        "path-missing", "error", "ckpt", "checkpoint_path",
        "expected the checkpoint_path directory (or nothing, before training), found a symbolic link loop")


@pytest.mark.parametrize("occupant", ["file", "loop", "dangling"])
def test_the_validator_reports_what_stands_at_checkpoint_path(example: Path, occupant: str) -> None:
    checkpoint = example.parent / "checkpoint"
    assert Layout.load(example).checkpoint_path == checkpoint
    if occupant == "file":
        checkpoint.write_text("not a directory")
    elif occupant == "loop":
        checkpoint.symlink_to(checkpoint.name)
    else:
        checkpoint.symlink_to("gone")
    found = {"file": "a file", "loop": "a symbolic link loop", "dangling": "a symbolic link to nothing (gone)"}
    issues = [i for i in validate_path(example).issues if i.rule == "path-missing"]
    assert [(i.file, i.dataset, i.message) for i in issues] == [
        ("checkpoint", None, f"expected the checkpoint_path directory {CHECKPOINT_PATH_RULE}, found {found[occupant]}")]


def test_nothing_at_checkpoint_path_is_no_issue(example: Path) -> None:
    report = validate_path(example)
    assert report.ok, report.issues
    assert "path-missing" not in report.rule_ids()


# ---- point 3: the validator asks the Layout, and parses the config once


def test_the_validator_resolves_no_config_path_itself() -> None:
    """Only the path given to ``validate_path`` is resolved by the validator (``storage.resolve``
    with one argument); the config's paths come from the Layout, never from the config's fields."""
    tree = ast.parse(VALIDATOR.read_text())
    resolves = [ast.unparse(call) for call in _calls(tree, "resolve")]
    assert resolves == ["storage.resolve(location)"]
    from_config = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                   and node.attr in CONFIG_PATHS and ast.unparse(node.value) in {"cfg", "config", "loaded.config"}]
    assert from_config == []


def test_the_validator_asks_the_layout_for_every_path(example: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    original = Layout.path

    def path(self: Layout, location: str) -> Any:
        asked.append(location)
        return original(self, location)

    monkeypatch.setattr(Layout, "path", path)
    layout = Layout.load(example, overrides=["init_path=warm"])
    asked.clear()
    validate_layout(layout)
    cfg = layout.config
    assert set(asked) == {cfg.entity_path, *cfg.edge_paths, cfg.checkpoint_path, "warm"}


def _spy_json(monkeypatch: pytest.MonkeyPatch, text: str) -> list[str]:
    parsed: list[str] = []
    loads = json.loads

    def spy(document: Any, *args: Any, **kwargs: Any) -> Any:
        if document == text:
            parsed.append(document)
        return loads(document, *args, **kwargs)

    monkeypatch.setattr(json, "loads", spy)
    return parsed


def test_validate_path_parses_the_config_once(example: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = _spy_json(monkeypatch, example.read_text(encoding="utf-8"))
    assert validate_path(example).ok
    assert len(parsed) == 1


def test_validate_layout_parses_no_config(example: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout.load(example)
    parsed = _spy_json(monkeypatch, example.read_text(encoding="utf-8"))
    assert validate_layout(layout).ok
    assert parsed == []


def test_the_keys_case_is_still_checked_on_the_json_as_written(example: Path) -> None:
    """The one parse serves both: the layout (overrides applied) and the mixedCase warning (on the
    file as written)."""
    raw = json.loads(example.read_text())
    raw["numEpochs"] = raw.pop("num_epochs", 1)
    example.write_text(json.dumps(raw))
    report = validate_path(example, overrides=["lr=0.05"])
    assert [(i.rule, i.dataset) for i in report.issues] == [("config-key-mixedcase", "numEpochs")]


def test_a_layout_from_the_json_read_is_the_layout_loaded(example: Path) -> None:
    raw = json.loads(example.read_text())
    assert Layout.from_json(example, raw, overrides=["lr=0.05"]) == Layout.load(example, overrides=["lr=0.05"])
    assert Layout.from_json(example, raw, base=example.parent / "x") == Layout.load(example, base=example.parent / "x")


@pytest.mark.parametrize(("occupant", "found"), [("loop", "a symbolic link loop"), ("file", "a file")])
def test_fit_refuses_what_stands_at_checkpoint_path_with_the_validators_issue(example: Path, occupant: str,
                                                                             found: str) -> None:
    """``pbgtrain fit`` asks the same predicate before it locks the directory (which a broken link
    or a file would stop it from creating): one ``path-missing`` issue naming ``checkpoint_path``."""
    pytest.importorskip("torch")
    from pbgio.errors import ConfigError
    from pbgtrain.train import fit

    layout = Layout.load(example)
    checkpoint = layout.checkpoint_path
    if occupant == "loop":
        checkpoint.symlink_to(checkpoint.name)
    else:
        checkpoint.write_text("notes")
    with pytest.raises(ConfigError) as refused:
        fit(layout)
    expected = checkpoint_path_occupied(str(checkpoint), found, "checkpoint_path")
    assert refused.value.issues == [expected]
    assert checkpoint.is_symlink() or checkpoint.read_text() == "notes"  # nothing was written there
