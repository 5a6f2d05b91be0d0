"""The README's reference tables are the code's own: settings, command lines, metrics, events."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import Field

from schemas.runtime.config import InorderSettings

ROOT = Path(__file__).resolve().parents[2]


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference", ROOT / "deploy" / "reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference"] = module
    spec.loader.exec_module(module)
    return module


reference = _reference()


def test_readme_tables_are_what_the_code_renders() -> None:
    """README.md equals its own re-rendering; run `make reference` after changing the code."""
    text = (ROOT / "README.md").read_text()
    assert reference.render(text) == text, "README reference tables are stale: make reference"


def test_a_changed_default_shows_as_drift() -> None:
    """A table edited by hand (a wrong default) is rewritten, so the drift test fails on it."""
    text = (ROOT / "README.md").read_text()
    edited = text.replace(
        "| `INORDER_POLL_TIMEOUT_MS` | 100 |", "| `INORDER_POLL_TIMEOUT_MS` | 500 |"
    )
    assert edited != text
    assert reference.render(edited) == text


def test_every_setting_of_every_process_is_in_the_readme() -> None:
    """Each variable any process reads appears in the README, including group ids."""
    text = (ROOT / "README.md").read_text()
    for name in (
        "INORDER_RELAY_GROUP_ID",
        "INORDER_SWEEPER_GROUP_ID",
        "INORDER_TOPIC_PARTITIONS",
        "INORDER_GAUGE_INTERVAL_S",
        "INORDER_POLL_TIMEOUT_MS",
    ):
        assert f"| `{name}` |" in text


def test_undocumented_setting_cannot_be_rendered() -> None:
    """A settings field without a description stops the rendering, naming it."""

    class Partial(InorderSettings):
        told: int = Field(default=1, description="documented")
        untold: int = 2

    with pytest.raises(reference.ReferenceError, match=r"Partial\.untold"):
        reference.settings_table(Partial)


def test_undocumented_argument_cannot_be_rendered() -> None:
    """A command-line argument without help stops the rendering, naming it."""
    parser = argparse.ArgumentParser(prog="tool")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("go", help="does it").add_argument("--fast", action="store_true")
    with pytest.raises(reference.ReferenceError, match="tool go: argument fast"):
        reference.cli_table(parser)


def test_unknown_block_in_the_readme_is_refused() -> None:
    """A generated block with no renderer is an error, not silently left as it is."""
    text = (ROOT / "README.md").read_text() + "<!-- generated: nothing -->\n<!-- end: nothing -->"
    with pytest.raises(reference.ReferenceError, match="'nothing'"):
        reference.render(text)
