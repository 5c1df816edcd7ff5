"""No import cycle between modules of the project, imports inside functions included.

import-linter's contracts (``make lint``) keep the apps in layers; this looks one level
down, file by file, with the same engine (grimp), which reads every import statement of
a module wherever it stands.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "root_packages"
]


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself),
    by Tarjan's algorithm, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                    break
                if child in on_stack:
                    low[module] = min(low[module], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1 or module in graph.find_modules_directly_imported_by(
                        module
                    ):
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for module in ("a", "a.one", "a.two", "a.three", "a.alone"):
        graph.add_module(module)
    graph.add_import(importer="a.one", imported="a.two")
    graph.add_import(importer="a.two", imported="a.three")
    graph.add_import(importer="a.three", imported="a.one")
    graph.add_import(importer="a.alone", imported="a.one")
    assert cycles(graph) == [["a.one", "a.three", "a.two"]]


def test_no_module_of_the_project_takes_part_in_an_import_cycle():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert cycles(graph) == []
