"""The import rules of `make lint` that name no app (lint-imports' contract types of our own).

``own_models``: each app's models (``<app>.models`` and the modules below it) are imported
by that app's own modules alone; another app reads them through the owner's selectors and
services. The apps are the project's root packages (``root_packages`` in pyproject.toml)
that own tables (they have migrations; ``common.models`` is abstract plumbing for all), so
an app added there is held to the rule without a contract of its own, and
``tests/deploy/test_import_rules.py`` fails for a package of the project left out of it.
The exceptions are ``ignore_imports`` lines, each with its reason beside it.
"""

from __future__ import annotations

import grimp
from importlinter import ContractCheck, fields
from importlinter.application import contract_utils
from importlinter.contracts.protected import BrokenContractMetadata, ProtectedContract


class OwnModelsContract(ProtectedContract):
    type_name = "own_models"

    # Not options here: every root package's models are protected, by that package alone.
    protected_modules = fields.ListField(subfield=fields.ModuleExpressionField(), required=False)
    allowed_importers = fields.ListField(subfield=fields.ModuleExpressionField(), required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph,
            ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=self.unmatched_ignore_imports_alerting,  # type: ignore[arg-type]
        )
        broken = []
        for app in sorted(self.session_options["root_packages"]):
            models = f"{app}.models"
            if models not in graph.modules or f"{app}.migrations" not in graph.modules:
                continue
            protected = {models} | graph.find_descendants(models)
            outsiders = {
                importer
                for importer in graph.find_modules_that_directly_import(models, as_package=True)
                if importer != app and not importer.startswith(f"{app}.")
            }
            links = sorted(
                (importer, imported)
                for importer in outsiders
                for imported in graph.find_modules_directly_imported_by(importer) & protected
            )
            if links:
                broken.append(
                    BrokenContractMetadata(
                        models,
                        [
                            {
                                "importer": importer,
                                "imported": imported,
                                "line_numbers": tuple(
                                    detail["line_number"]
                                    for detail in graph.get_import_details(
                                        importer=importer, imported=imported
                                    )
                                ),
                            }
                            for importer, imported in links
                        ],
                        None,
                    )
                )
        return ContractCheck(
            kept=not broken,
            warnings=list(removal.warnings),
            ignored_import_count=removal.ignored_import_count,
            metadata={"illegal_imports": broken},
        )
