"""The repository's import graph has no cycles (issue 21).

Built with grimp (the graph behind import-linter) from every package of the repo, tests
included: imports inside functions and under ``TYPE_CHECKING`` count too, so a cycle
cannot be hidden by moving an import into a function. A cycle is reported as its
strongly connected component (every module on it) with one shortest loop through it.
"""

from __future__ import annotations

import sys

import grimp
import pytest

from devtools.process import REPO_ROOT

PACKAGES = (
    "agent",
    "coordinator",
    "models",
    "edgefleet",
    "edgefleet_client",
    "devtools",
    "benchmarks",
    "edge_images",
    "tests",
)


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm over the module graph; components of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(module: str) -> None:
        nonlocal counter
        index[module] = low[module] = counter
        counter += 1
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        for module in sorted(graph.modules):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return found


def build_graph() -> grimp.ImportGraph:
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    first, rest = component[0], component[1:]
    loop: tuple[str, ...] = ()
    for other in rest:
        there = graph.find_shortest_chain(importer=first, imported=other)
        back = graph.find_shortest_chain(importer=other, imported=first)
        if there and back and (not loop or len(there) + len(back) - 1 < len(loop)):
            loop = tuple(there) + tuple(back[1:])
    return f"{len(component)} modules: {', '.join(component)}\n    e.g. {' -> '.join(loop)}"


def test_no_import_cycles_anywhere_in_the_repo() -> None:
    graph = build_graph()
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n  " + "\n  ".join(describe(graph, c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above could pass with the finder broken: give it a known loop."""
    graph = grimp.ImportGraph()
    for name in ("p", "p.a", "p.b", "p.c", "p.d"):
        graph.add_module(name)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    graph.add_import(importer="p.d", imported="p.a")
    assert strongly_connected(graph) == [["p.a", "p.b", "p.c"]]
    assert "p.a -> p.b -> p.c -> p.a" in describe(graph, ["p.a", "p.b", "p.c"])


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_in_the_graph(package: str) -> None:
    """A package missing from PACKAGES' graph (renamed, say) would escape the check."""
    graph = build_graph()
    assert any(m == package or m.startswith(package + ".") for m in graph.modules)
