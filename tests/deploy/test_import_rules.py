"""The import rules of ``make lint`` hold every package of the project, one added later too.

import-linter sees only its root packages: a package of the project left out of them, or
out of the layers, would be checked by nothing. The rule on models names no app
(``scripts/import_rules.py``); it is shown here refusing an import on a small project of
its own, and passing the same project once the import goes through a selector.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
# Folders of Python code that are not the product: checked by other means.
NOT_THE_PRODUCT = {"tests", "bench", "scripts"}


def contract(name_start: str) -> dict:
    return next(c for c in CONFIG["contracts"] if c["name"].startswith(name_start))


def project_packages() -> set[str]:
    return {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if path.parent.name not in NOT_THE_PRODUCT and not path.parent.name.startswith(".")
    }


def test_every_package_of_the_project_is_a_root_package_of_the_import_rules():
    assert set(CONFIG["root_packages"]) == project_packages()


def test_every_root_package_stands_in_a_layer():
    layers = contract("apps stand in layers")["layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    assert placed == set(CONFIG["root_packages"])


def test_the_broker_imports_no_other_package_of_the_project():
    forbidden = set(contract("broker is the ground floor")["forbidden_modules"])
    # lifecycle stands below the broker (the daemon loop and its conditions).
    assert forbidden == set(CONFIG["root_packages"]) - {"broker", "lifecycle"}


def lint(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (tmp_path / ".importlinter").write_text(
        textwrap.dedent(
            """
            [importlinter]
            root_packages =
                billing
                shop
            contract_types =
                own_models: import_rules.OwnModelsContract

            [importlinter:contract:own-models]
            name = each app's models are its own
            type = own_models
            """
        )
    )
    (tmp_path / "import_rules.py").write_text((ROOT / "scripts" / "import_rules.py").read_text())
    return subprocess.run(
        [Path(sys.executable).parent / "lint-imports", "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


APPS = {
    "billing/__init__.py": "",
    "billing/migrations/__init__.py": "",
    "billing/models.py": "class Invoice: ...\n",
    "billing/selectors.py": "from billing.models import Invoice\n",
    "billing/services.py": "from billing.models import Invoice\n",
    "shop/__init__.py": "",
    "shop/migrations/__init__.py": "",
    "shop/models.py": "class Order: ...\n",
}


def test_the_models_rule_refuses_an_app_importing_another_apps_models(tmp_path):
    result = lint(tmp_path, {**APPS, "shop/services.py": "from billing.models import Invoice\n"})

    assert result.returncode == 1, result.stdout + result.stderr
    assert "shop.services -> billing.models (l.1)" in result.stdout


def test_the_models_rule_lets_an_app_read_another_through_its_selectors(tmp_path):
    result = lint(tmp_path, {**APPS, "shop/services.py": "from billing import selectors\n"})

    assert result.returncode == 0, result.stdout + result.stderr
    assert "each app's models are its own KEPT" in result.stdout
