"""Outside ``consumer/kinds/`` nothing names a kind: no import of its modules, no type test."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer.kinds import KINDS
from tests.support.services import ROOT

CONSUMER = ROOT / "consumer"
KIND_PACKAGE = CONSUMER / "kinds"
INTERNALS = tuple(f"consumer.kinds.{name}" for name in ("steps", "batches", "projection"))


def _outside_kinds() -> list[Path]:
    return sorted(p for p in CONSUMER.rglob("*.py") if KIND_PACKAGE not in p.parents)


def _route_classes() -> set[str]:
    """Every class the kind modules define (route dataclasses among them)."""
    names: set[str] = set()
    for path in KIND_PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names |= {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    return names


def _imports(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _kind_checks(tree: ast.AST, classes: set[str]) -> Iterator[str]:
    """``isinstance`` on a kind's class, and a comparison or case on a kind's name."""
    kind_names = set(KINDS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if named & classes:
                yield f"line {node.lineno}: isinstance on {sorted(named & classes)}"
        elif isinstance(node, ast.Compare | ast.MatchValue):
            for const in ast.walk(node):
                if isinstance(const, ast.Constant) and const.value in kind_names:
                    yield f"line {node.lineno}: compares with the kind name {const.value!r}"


@pytest.mark.parametrize("path", _outside_kinds(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_outside_the_kinds_imports_a_kind_s_internals(path: Path) -> None:
    """The loop, sweeper, admin and testing reach kinds only through the registry."""
    tree = ast.parse(path.read_text())
    reached = sorted({m for m in _imports(tree) if m.startswith(INTERNALS)})
    assert reached == []


@pytest.mark.parametrize("path", _outside_kinds(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_outside_the_kinds_branches_on_a_kind(path: Path) -> None:
    """No isinstance on a kind's class and no comparison with a kind's name outside the kinds."""
    tree = ast.parse(path.read_text())
    assert list(_kind_checks(tree, _route_classes())) == []


def test_the_checks_catch_what_they_forbid() -> None:
    """A module that imports a step internal and branches on a route class is flagged."""
    tree = ast.parse(
        "from consumer.kinds.steps.parking import ParkingLot\n"
        "import consumer.kinds.batches.runner\n"
        "from consumer.kinds import steps\n"
        "if isinstance(route, StepRoute): pass\n"
        "if route.kind == 'batch': pass\n"
        "match route.kind:\n    case 'projection': pass\n"
    )
    reached = {m for m in _imports(tree) if m.startswith(INTERNALS)}
    assert {"consumer.kinds.steps.parking", "consumer.kinds.batches.runner"} <= reached
    assert "consumer.kinds.steps" in reached
    found = list(_kind_checks(tree, _route_classes()))
    assert [f.split(":")[0] for f in found] == ["line 4", "line 5", "line 7"]


def test_no_file_outside_the_kinds_names_a_kind_s_modules() -> None:
    """SQL, docs and templates outside the kinds name no kind module either (text search)."""
    found = []
    for path in sorted(CONSUMER.rglob("*")):
        if path.is_dir() or KIND_PACKAGE in path.parents or "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [
            f"{path.relative_to(ROOT)}:{number}"
            for number, line in enumerate(text.splitlines(), 1)
            if any(name in line for name in INTERNALS)
        ]
    assert found == []
