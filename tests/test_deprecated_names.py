"""Renamed public names keep working for one release, each with a ``DeprecationWarning`` that names
the new one and points at the user's own import line (issue 48)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

RENAMED_NAMES = [
    ("pbgio.testing", "Layout", "LayoutContents"),
    ("pbgio.testing", "CheckpointLayout", "CheckpointContents"),
    ("pbgio.testing.layouts", "Layout", "LayoutContents"),
    ("pbgio.testing.layouts", "CheckpointLayout", "CheckpointContents"),
    ("pbgio", "plan_checkpoint", "commit_steps"),
    ("pbgio.checkpoint", "plan_checkpoint", "commit_steps"),
]
"""(module, old name, new name)."""

RENAMED_MODULES = [
    ("pbgio.pyconfig", "pbgio.layout", ["config_from_python", "load_python_config"]),
    ("pbgtrain.validation", "pbgtrain.early_stopping", ["ValidationRule", "checkpoint_evaluator"]),
    ("pbgtrain.plan", "pbgtrain.schedule", []),
]
"""(old module, the module it now is, documented names imported from the old one)."""


@pytest.mark.parametrize(("module", "old", "new"), RENAMED_NAMES)
def test_an_old_name_is_the_new_object_with_a_warning(module: str, old: str, new: str) -> None:
    imported = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{old} is now {module}\.{new}; .* next release") as caught:
        value = getattr(imported, old)
    assert value is getattr(imported, new)
    assert caught[0].filename == __file__  # the user's line, not pbgio's


@pytest.mark.parametrize(("old", "new", "names"), RENAMED_MODULES)
def test_an_old_module_is_the_new_module_with_a_warning(old: str, new: str, names: list[str]) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} is now {new}; .* next release"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    for name in names:
        assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_a_script_sees_the_warning_under_pythons_default_filters() -> None:
    """DeprecationWarning is shown by default only when it is attributed to ``__main__``."""
    module, old, _ = RENAMED_NAMES[0]
    done = subprocess.run([sys.executable, "-c", f"from {module} import {old}"], capture_output=True, text=True,
                          check=True)
    assert f"<string>:1: DeprecationWarning: {module}.{old} is now" in done.stderr


def test_the_new_names_import_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for module, _, new in RENAMED_NAMES:
            getattr(importlib.import_module(module), new)


PACKAGE_SUBMODULES = [("pbgtrain.plan", "pbgtrain.schedule", ["batching", "buckets"])]


@pytest.mark.parametrize(("old", "new", "subs"), PACKAGE_SUBMODULES)
def test_a_renamed_packages_submodules_are_the_new_ones(old: str, new: str, subs: list[str]) -> None:
    """Not second copies (whose classes would differ from the ones the trainer uses)."""
    for name in [old, *(f"{old}.{s}" for s in subs)]:
        sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} is now {new}"):
        importlib.import_module(f"{old}.{subs[0]}")
    for sub in subs:
        assert importlib.import_module(f"{old}.{sub}") is importlib.import_module(f"{new}.{sub}")


def test_fit_options_take_validate_as_check_layout_with_a_warning() -> None:
    pytest.importorskip("torch")
    from pbgtrain.train import FitOptions

    with pytest.warns(DeprecationWarning, match=r"FitOptions\(validate=\.\.\.\) is now FitOptions\(check_layout=") \
            as caught:
        options = FitOptions(validate=False, seed=3)
    assert options == FitOptions(check_layout=False, seed=3)
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert FitOptions().check_layout
