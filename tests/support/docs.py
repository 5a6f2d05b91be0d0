"""The code blocks of the documentation a user would copy, by the name marked above each.

A block is marked with ``<!-- example: NAME -->`` on the line before its opening fence;
tests run each marked block, so what the documentation shows is what works.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
FRONT = ROOT / "README.md"
PRODUCER = ROOT / "producer" / "README.md"
CONSUMER = ROOT / "consumer" / "README.md"
DEBEZIUM = ROOT / "consumer" / "debezium.md"
RELAY = ROOT / "outbox_relay" / "README.md"
DEPLOY = ROOT / "deploy" / "README.md"
# Every document a user reads, each checked for unmarked or untested code blocks.
DOCS = (
    FRONT,
    PRODUCER,
    CONSUMER,
    DEBEZIUM,
    RELAY,
    DEPLOY,
    ROOT / "tests" / "README.md",
    ROOT / "tests" / "benchmarks" / "README.md",
)
_MARKED = re.compile(r"<!-- example: ([\w-]+) -->\n```[\w-]*\n(.*?)\n```", re.DOTALL)


def examples(path: Path) -> dict[str, str]:
    """Every marked block of the Markdown file ``path`` by name."""
    found: dict[str, str] = {}
    for name, body in _MARKED.findall(path.read_text()):
        assert name not in found, f"{path}: example {name} is marked twice"
        found[name] = body + "\n"
    return found


def example(name: str, path: Path = FRONT) -> str:
    """The block marked ``name`` in ``path``."""
    return examples(path)[name]


def module_of(name: str, folder: Path, path: Path = FRONT) -> ModuleType:
    """The block marked ``name`` written to ``folder`` and imported as a module of its own."""
    source = folder / f"example_{name.replace('-', '_')}.py"
    source.write_text(example(name, path))
    spec = importlib.util.spec_from_file_location(source.stem, source)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[source.stem] = module  # annotations are resolved through it
    spec.loader.exec_module(module)
    return module
