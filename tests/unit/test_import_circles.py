"""The import structure has no circle: every module of ours stands on modules below it.

Imports made only for type checking count too: a circle there is a circle in the design.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping

from tests.support.services import ROOT

PACKAGES = ("schemas", "consumer", "producer", "outbox_relay")


def _module(path_parts: tuple[str, ...]) -> str:
    parts = list(path_parts)
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, ast.Module]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[_module(path.relative_to(ROOT).parts)] = ast.parse(path.read_text())
    return found


def _resolve(name: str, known: Mapping[str, object]) -> str | None:
    """The module ``name`` is, or is in (``a.b.C`` is the class C of module ``a.b``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported(tree: ast.Module, known: Mapping[str, object]) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found = _resolve(f"{node.module}.{alias.name}", known)
                if found:
                    yield found
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found = _resolve(alias.name, known)
                if found:
                    yield found


def graph(modules: Mapping[str, ast.Module]) -> dict[str, set[str]]:
    """Each module and the modules of ours it imports (itself left out)."""
    return {name: set(_imported(tree, modules)) - {name} for name, tree in modules.items()}


def circles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Every set of two or more modules that reach each other (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_ours_is_in_an_import_circle() -> None:
    """No two modules import each other, directly or through others (type-only imports too)."""
    assert circles(graph(_modules())) == []


def test_the_check_finds_a_planted_circle() -> None:
    """A kind module importing the loop that imports it is a circle; a chain is not."""
    planted = {
        "consumer.loop.settle": ast.parse("from consumer.kinds._outcome import Outcome\n"),
        "consumer.kinds._outcome": ast.parse(
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from consumer.loop.settle import report\n"
        ),
        "consumer.kinds._base": ast.parse("from consumer.kinds._outcome import Outcome\n"),
    }
    assert circles(graph(planted)) == [["consumer.kinds._outcome", "consumer.loop.settle"]]
    del planted["consumer.kinds._outcome"]
    assert circles(graph(planted)) == []
