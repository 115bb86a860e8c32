"""An import-linter contract type the built-in ones lack: an allow-list.

``allowed_imports``: the modules of ``source_modules`` (packages, with everything inside) may
import, of the ``target`` package, only the modules ``allowed_modules`` names (module
expressions, ``*`` and ``**`` wildcards allowed; a name alone is that module only, not its
children). Every direct import, those inside functions and under ``TYPE_CHECKING`` included,
counts. ``pyproject.toml`` registers it (``contract_types``) for the contract "pbgtrain uses only
pbgio's public API"; ``lint-imports`` finds this module because it runs from the repository root
(it puts the current directory on ``sys.path``), as ``.ci/run`` and ``tests/test_architecture.py``
run it.
"""

from __future__ import annotations

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
        violations: list[dict[str, Any]] = []
        for importer in sorted(sources):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if (imported == target or imported.startswith(f"{target}.")) and imported not in allowed:
                    lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer,
                                                                                      imported=imported))
                    violations.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for found in check.metadata["violations"]:
            lines = ", ".join(f"l.{n}" for n in found["lines"])
            output.print_error(f"{found['importer']} imports {found['imported']} ({lines}), which the allow-list "
                               "does not name", bold=False)
        output.new_line()
