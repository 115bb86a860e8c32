"""The allow-list contract sees through lazy re-exports (issue 48, point 7): a name taken from a
package that re-exports it lazily (PEP 562 ``__getattr__`` over a ``lazy_exports`` table, which
the import graph cannot see) counts as an import of the module that provides it, so ``from pbgio
import validate_layout`` is judged as an import of ``pbgio.validate``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="needs grimp (pip install -e '.[lint]': import-linter)")
tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with tomllib (Python 3.11+)")

from tools.import_contracts import AllowedImportsContract, lazy_exports_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _contract(source: str, target: str, allowed: list[str]) -> AllowedImportsContract:
    return AllowedImportsContract(name="allow-list", session_options={},
                                  contract_options={"source_modules": [source], "target": target,
                                                    "allowed_modules": allowed})


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> grimp.ImportGraph:
    """A throwaway target package (``lzt``) re-exporting ``hidden`` (from the forbidden
    ``lzt.secret``, also under an old name) and ``shown`` (from the allowed ``lzt.public``) lazily,
    and a source package (``lzs``) taking them in each way a module can."""
    _write(tmp_path, {
        "lzt/__init__.py": """
            from lzt.lazy import lazy_exports, renamed_names

            __all__, _export = lazy_exports("lzt", {"lzt.secret": ["hidden"], "lzt.public": ["shown"]})
            __getattr__ = renamed_names("lzt", {"old_hidden": "hidden"}, fallback=_export)
            """,
        "lzt/lazy.py": """
            import importlib

            def lazy_exports(package, exports):
                where = {name: module for module, names in exports.items() for name in names}
                return sorted(where), lambda name: getattr(importlib.import_module(where[name]), name)

            def renamed_names(package, renames, fallback):
                return lambda name: fallback(renames.get(name, name))
            """,
        "lzt/secret.py": "def hidden():\n    return 1\n",
        "lzt/public.py": "def shown():\n    return 2\n",
        "lzs/__init__.py": "",
        "lzs/by_name.py": "from lzt import hidden\n",
        "lzs/in_function.py": "def f():\n    from lzt import shown, hidden\n    return shown() + hidden()\n",
        "lzs/by_attribute.py": "import lzt as target\n\n\ndef f():\n    return target.old_hidden()\n",
        "lzs/fine.py": "import lzt\nfrom lzt import shown\n\nlzt.shown()\n",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    return grimp.build_graph("lzs", "lzt", cache_dir=None)


def test_the_lazy_table_is_read_without_importing(pair: grimp.ImportGraph) -> None:
    import sys

    assert lazy_exports_of("lzt") == {"hidden": "lzt.secret", "shown": "lzt.public", "old_hidden": "lzt.secret"}
    assert "lzt" not in sys.modules


def test_a_forbidden_module_reached_through_a_lazy_re_export_breaks_the_contract(pair: grimp.ImportGraph) -> None:
    check = _contract("lzs", "lzt", ["lzt", "lzt.public"]).check(pair, verbose=False)
    assert not check.kept
    found = [(v["importer"], v["imported"], v["lines"], v["via"]) for v in check.metadata["violations"]]
    assert found == [
        ("lzs.by_attribute", "lzt.secret", [5], ["lzt.old_hidden"]),
        ("lzs.by_name", "lzt.secret", [1], ["lzt.hidden"]),
        ("lzs.in_function", "lzt.secret", [2], ["lzt.hidden"]),
    ]


def test_allowing_the_providing_module_keeps_it(pair: grimp.ImportGraph) -> None:
    assert _contract("lzs", "lzt", ["lzt", "lzt.public", "lzt.secret"]).check(pair, verbose=False).kept


def test_the_real_contract_sees_the_validator_taken_from_pbgio() -> None:
    """pbgtrain's fit takes ``validate_layout`` from the package root: without ``pbgio.validate`` on
    the allow-list, that is a broken contract (it was invisible before issue 48)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (options,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "pbgtrain-public-pbgio"]
    allowed = [m for m in options["allowed_modules"] if m != "pbgio.validate"]
    assert len(allowed) == len(options["allowed_modules"]) - 1
    graph = grimp.build_graph("pbgio", "pbgtrain", cache_dir=None)
    check = _contract("pbgtrain", "pbgio", allowed).check(graph, verbose=False)
    broken = {(v["importer"], v["imported"]) for v in check.metadata["violations"]}
    assert ("pbgtrain.train", "pbgio.validate") in broken
    assert _contract("pbgtrain", "pbgio", options["allowed_modules"]).check(graph, verbose=False).kept
