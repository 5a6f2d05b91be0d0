"""The kinds and the core stand apart: the core names no kind, and the kinds stand below it.

Outside ``consumer/kinds/`` nothing imports a kind's modules or tests a kind's type; the
core's metrics, errors and dead-letter reasons hold no kind's vocabulary; and nothing
under ``consumer/kinds/`` imports the programs that host the kinds.
"""

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
# What hosts the kinds: the kinds import none of it.
HOSTS = ("consumer.admin", "consumer.loop", "consumer.sweeper", "consumer.service")
# The core's vocabulary modules, and the words that are a kind's (its name and its means).
CORE_VOCABULARY = ("metrics.py", "errors.py", "deadletter.py")
KIND_WORDS = ("step", "batch", "projection", "park", "lane", "gap", "review", "assembl")


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


# The one place a kind's module is named outside the kinds: the programs' settings
# compose each kind's process model (the same class its ``Kind.process`` names).
COMPOSED = {CONSUMER / "settings.py": {"consumer.kinds.steps.settings"}}


def _reached(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = {m for m in _imports(tree) if m.startswith(INTERNALS)}
    allowed = COMPOSED.get(path, set())
    return sorted(m for m in found if m not in allowed and m.rpartition(".")[0] not in allowed)


@pytest.mark.parametrize("path", _outside_kinds(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_outside_the_kinds_imports_a_kind_s_internals(path: Path) -> None:
    """The loop, sweeper, admin and testing reach kinds only through the registry."""
    assert _reached(path) == []


def test_the_settings_compose_exactly_the_kinds_process_models() -> None:
    """What the settings import of a kind is the model its registry entry names, no more."""
    from consumer.kinds import KINDS  # noqa: PLC0415
    from consumer.settings import ConsumerSettings  # noqa: PLC0415

    models = [k.process for k in KINDS.values() if k.process is not None]
    assert {f"{m.__module__}" for m in models} == COMPOSED[CONSUMER / "settings.py"]
    assert all(issubclass(ConsumerSettings, m) for m in models)


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
            and not any(allowed in line for allowed in COMPOSED.get(path, ()))
        ]
    assert found == []


def _symbols(tree: ast.Module) -> Iterator[str]:
    """The names a module defines at its top: classes, functions and assignments."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            yield node.name
        elif isinstance(node, ast.Assign):
            yield from (t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id


def _kind_symbols(tree: ast.Module) -> list[str]:
    return [s for s in _symbols(tree) if any(w in s.lower() for w in KIND_WORDS)]


def _hosts_imported(tree: ast.AST) -> list[str]:
    return sorted({m for m in _imports(tree) if m.startswith(HOSTS)})


@pytest.mark.parametrize("path", sorted(KIND_PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_no_kind_imports_what_hosts_it(path: Path) -> None:
    """Nothing under the kinds imports the admin, the loop, the sweeper or the service."""
    assert _hosts_imported(ast.parse(path.read_text())) == []


@pytest.mark.parametrize("name", CORE_VOCABULARY)
def test_the_core_vocabulary_names_no_kind(name: str) -> None:
    """The core's metrics, errors and dead-letter reasons define no kind's symbol."""
    assert _kind_symbols(ast.parse((CONSUMER / name).read_text())) == []


def test_the_outbound_checks_catch_what_they_forbid() -> None:
    """A kind importing the admin or the loop, and a core step metric, are both flagged."""
    tree = ast.parse(
        "from consumer.admin.audit import Audit\n"
        "import consumer.loop.settle\n"
        "from consumer import service\n"
        "from consumer.kinds._base import Applier\n"
    )
    assert _hosts_imported(tree) == [
        "consumer.admin.audit",
        "consumer.admin.audit.Audit",
        "consumer.loop.settle",
        "consumer.service",
    ]
    core = ast.parse(
        'PARKED = Counter("events_parked_total", "")\n'
        "class StepFailedError(Exception): ...\n"
        'BATCH_REJECTED = "batch_rejected"\n'
        'APPLIED = Counter("events_applied_total", "")\n'
    )
    assert _kind_symbols(core) == ["PARKED", "StepFailedError", "BATCH_REJECTED"]
