"""An import-linter contract type the stock ones lack: a whitelist.

`forbidden` names what a layer may not import; "the core imports only the standard library"
is the opposite statement, so it is checked as one: every module the source modules import
directly is one of them, one of `allowed_modules`, or part of the standard library.
"""

from __future__ import annotations

import sys

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output
from importlinter.domain.helpers import module_expressions_to_modules


class OnlyImportsContract(Contract):
    """`source_modules` (expressions, as in `forbidden`) import nothing but themselves, the
    standard library and `allowed_modules` (internal modules or external top-level packages)."""

    type_name = "only_imports"

    source_modules = fields.SetField(subfield=fields.ModuleExpressionField())
    allowed_modules = fields.SetField(subfield=fields.ModuleExpressionField(), required=False)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources = set()
        for module in module_expressions_to_modules(graph, self.source_modules):
            sources |= {module.name} | graph.find_descendants(module.name)
        allowed = sources | {m.name for m in module_expressions_to_modules(
            graph, self.allowed_modules or set())}
        stray = []
        for importer in sorted(sources):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if imported in allowed or _within(imported, allowed) or _stdlib(imported):
                    continue
                lines = [d["line_number"] for d in graph.get_import_details(
                    importer=importer, imported=imported)]
                stray.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not stray, metadata={"stray": stray})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for item in check.metadata["stray"]:
            lines = ", ".join(f"l.{n}" for n in item["lines"])
            output.print_error(f"{item['importer']} -> {item['imported']} ({lines})")
            output.new_line()


def _within(module: str, packages: set[str]) -> bool:
    return any(module.startswith(f"{p}.") for p in packages)


def _stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names
