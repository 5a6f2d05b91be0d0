"""The tree is the architecture: the package rule and the consumer's shape, checked."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIDE_BY_SIDE = ("producer", "outbox_relay", "consumer")


def _imported(package: str) -> set[str]:
    """Top-level names of inorder packages imported anywhere in ``package``."""
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
    return found & {"schemas", *SIDE_BY_SIDE}


@pytest.mark.parametrize("package", SIDE_BY_SIDE)
def test_the_three_components_never_import_each_other(package: str) -> None:
    """consumer, producer and outbox_relay stand on schemas only."""
    assert _imported(package) <= {"schemas", package}


def test_schemas_imports_nothing_of_ours() -> None:
    """schemas is the bottom floor."""
    assert _imported("schemas") <= {"schemas"}


def test_the_consumer_has_at_most_sixteen_modules_at_its_top() -> None:
    """Concepts that span files are subpackages; the consumer's top stays small."""
    top = [p for p in (ROOT / "consumer").iterdir() if p.suffix == ".py"]
    packages = [p for p in (ROOT / "consumer").iterdir() if (p / "__init__.py").exists()]
    assert len(top) + len(packages) <= 16


def test_the_pytest_plugin_loads_without_hypothesis() -> None:
    """Installing inorder must not break pytest for users without the testing extra."""
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "import consumer.testing.plugin, consumer.testing as t\n"
        "assert t.RouteDriver and t.event\n"
        "try:\n    t.check_order_independence\nexcept ImportError:\n    print('lazy')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "lazy"), done.stderr
