"""An import-linter contract type the built-in ones lack: an allow-list.

``allowed_imports``: the modules of ``source_modules`` (packages, with everything inside) may
import, of the ``target`` package, only the modules ``allowed_modules`` names (module
expressions, ``*`` and ``**`` wildcards allowed; a name alone is that module only, not its
children). Every direct import, those inside functions and under ``TYPE_CHECKING`` included,
counts; so does a name taken from ``target`` itself that ``target`` re-exports lazily (PEP 562:
its ``__init__`` builds ``__getattr__`` from a ``lazy_exports(...)`` table, which the import
graph cannot see): ``from pbgio import validate_layout``, or ``pbgio.validate_layout`` after
``import pbgio``, is an import of ``pbgio.validate``, the module the table names for it. Both
the table (with the old names of ``renamed_names(...)``) and the names a module takes are read
statically, with :mod:`ast`: nothing is imported.

``pyproject.toml`` registers it (``contract_types``) for the contract "pbgtrain uses only pbgio's
public API"; ``lint-imports`` finds this module because it runs from the repository root (it puts
the current directory on ``sys.path``), as ``.ci/run`` and ``tests/test_architecture.py`` run it.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grimp
from importlinter import Contract, ContractCheck, fields, output
from importlinter.domain.helpers import module_expressions_to_modules


class AllowedImportsContract(Contract):
    """``source_modules`` import nothing of ``target`` but ``allowed_modules`` (see the module)."""

    type_name = "allowed_imports"

    source_modules = fields.ListField(subfield=fields.ModuleExpressionField())
    target = fields.StringField()
    allowed_modules = fields.ListField(subfield=fields.ModuleExpressionField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        target = str(self.target)  # type: ignore[attr-defined]
        allowed = {m.name for m in module_expressions_to_modules(graph, self.allowed_modules)}  # type: ignore[arg-type]
        sources = {m.name for m in module_expressions_to_modules(graph, self.source_modules, as_packages=True)}  # type: ignore[arg-type]
        sources |= {child for name in sources for child in graph.find_descendants(name)}
        exported = lazy_exports_of(target)
        violations: list[dict[str, Any]] = []
        for importer in sorted(sources):
            imports = set(graph.find_modules_directly_imported_by(importer))
            for imported in sorted(imports):
                if (imported == target or imported.startswith(f"{target}.")) and imported not in allowed:
                    lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer,
                                                                                      imported=imported))
                    violations.append({"importer": importer, "imported": imported, "lines": lines, "via": []})
            if exported and any(m == target or m.startswith(f"{target}.") for m in imports):
                violations += _lazy_violations(importer, target, exported, allowed)
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for found in check.metadata["violations"]:
            lines = ", ".join(f"l.{n}" for n in found["lines"])
            via = "".join(f", through the lazy re-export {name}" for name in found["via"])
            output.print_error(f"{found['importer']} imports {found['imported']} ({lines}{via}), which the allow-list "
                               "does not name", bold=False)
        output.new_line()


def _lazy_violations(importer: str, target: str, exported: dict[str, str], allowed: set[str]) -> list[dict[str, Any]]:
    """The imports of forbidden modules ``importer`` makes by taking names ``target`` re-exports
    lazily (``exported``: name → the module that provides it), one entry per module."""
    path = module_file(importer)
    if path is None:
        return []
    found: dict[str, dict[str, Any]] = {}
    for name, line in names_taken(path.read_text(encoding="utf-8"), target):
        provider = exported.get(name)
        if provider is None or provider in allowed or not (provider == target or provider.startswith(f"{target}.")):
            continue
        entry = found.setdefault(provider, {"importer": importer, "imported": provider, "lines": [], "via": []})
        entry["lines"] = sorted({*entry["lines"], line})
        if f"{target}.{name}" not in entry["via"]:
            entry["via"].append(f"{target}.{name}")
    return [found[m] for m in sorted(found)]


def module_file(module: str) -> Path | None:
    """The source file of ``module`` (a package's ``__init__.py``), found without importing it
    or its packages (only the top-level package is looked up on ``sys.path``)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    if spec.submodule_search_locations is None:
        return Path(spec.origin) if not rest and spec.origin else None
    for location in spec.submodule_search_locations:
        folder = Path(location).joinpath(*rest)
        candidates = [folder / "__init__.py"] + ([folder.with_name(f"{rest[-1]}.py")] if rest else [])
        for candidate in candidates:
            if candidate.is_file():
                return candidate
    return None


def lazy_exports_of(package: str) -> dict[str, str]:
    """The names ``package`` re-exports lazily, each with the module that provides it: the table
    of its ``__init__``'s ``lazy_exports(name, {module: [names]})`` call, and the old names of a
    ``renamed_names(name, {old: new})`` call mapped as their new ones, read with :mod:`ast`
    (``{}`` when it has none)."""
    path = module_file(package)
    if path is None or path.name != "__init__.py":
        return {}
    exported: dict[str, str] = {}
    renamed: dict[str, str] = {}
    for call in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(call, ast.Call) or len(call.args) < 2 or not isinstance(call.args[1], ast.Dict):
            continue
        function = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        if function == "lazy_exports":
            table = ast.literal_eval(call.args[1])
            exported.update({name: module for module, names in table.items() for name in names})
        elif function == "renamed_names":
            renamed.update(ast.literal_eval(call.args[1]))
    exported.update({old: exported[new] for old, new in renamed.items() if new in exported})
    return exported


def names_taken(source: str, package: str) -> Iterator[tuple[str, int]]:
    """The names a module's ``source`` takes from ``package`` itself, with their lines: ``from
    package import name``, and ``package.name`` where ``package`` is bound by ``import package``
    (``as`` another name, or ``import package.sub``).

    >>> text = "import pbgio as p\\nfrom pbgio import a, storage\\nimport pbgio.x\\np.b()\\npbgio.c\\n"
    >>> sorted(names_taken(text, "pbgio"))
    [('a', 2), ('b', 4), ('c', 5), ('storage', 2)]
    """
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # a local name → the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == package:
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is not None:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and bound.get(node.value.id) == package:
            yield node.attr, node.lineno
