""".env.example keeps up with the settings: it lists every variable they read, and each
line that sets one gives the settings' own default (a line left as it is changes nothing,
as the file says)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.docs.test_operations import settings_variables

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / ".env.example").read_text()
SET = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$", flags=re.MULTILINE)
LISTED = re.compile(r"^(?:# ?)?([A-Z][A-Z0-9_]*)=", flags=re.MULTILINE)


def code_defaults() -> dict[str, object]:
    """Each variable's ``default=`` in hubdommed/settings.py, where it is a plain value
    (arithmetic of constants included: ``15 * 60``)."""
    tree = ast.parse((ROOT / "hubdommed" / "settings.py").read_text())
    defaults = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        name = node.args[0]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        given = [kw.value for kw in node.keywords if kw.arg == "default"] or node.args[1:2]
        if not given:
            continue
        try:
            value = constant(given[0])
        except ValueError:
            continue  # depends on another setting (DEBUG, say): commented out in the file
        defaults[name.value] = value
    return defaults


def constant(node: ast.expr) -> object:
    """A default made of constants: ``30``, ``7 * 24 * 3600``, ``["critical", ...]``."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        return [constant(item) for item in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return constant(node.left) * constant(node.right)
    raise ValueError(ast.dump(node))


def test_every_variable_the_settings_read_is_listed():
    missing = sorted(name for name in settings_variables() if name not in LISTED.findall(EXAMPLE))
    assert not missing, missing


def test_each_line_that_sets_a_variable_gives_its_default():
    defaults = code_defaults()
    read = settings_variables()
    wrong = {}
    for name, value in SET.findall(EXAMPLE):
        assert name in read, f"{name} is set in .env.example but no setting reads it"
        default = defaults[name]
        if isinstance(default, bool):
            same = value.lower() == str(default).lower()
        elif isinstance(default, int | float):
            same = float(value) == default
        elif isinstance(default, list):
            same = value.split(",") == default
        else:
            same = value == default
        if not same:
            wrong[name] = (value, default)
    assert not wrong, wrong
