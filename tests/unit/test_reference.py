"""The READMEs' reference tables are the code's own: settings, commands, metrics, alerts."""

from __future__ import annotations

import argparse
import importlib.util
import re
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


def test_every_document_is_what_the_code_renders() -> None:
    """Each README equals its own re-rendering; run `make reference` after changing the code."""
    for path, text in reference.render_all().items():
        assert text == path.read_text(), f"{path} reference tables are stale: make reference"


def test_a_changed_default_shows_as_drift() -> None:
    """A table edited by hand (a wrong default) is rewritten, so the drift test fails on it."""
    path = ROOT / "deploy" / "README.md"
    text = path.read_text()
    edited = text.replace(
        "| `INORDER_POLL_TIMEOUT_MS` | 100 |", "| `INORDER_POLL_TIMEOUT_MS` | 500 |"
    )
    assert edited != text
    assert reference.render(edited, path) == text


def test_every_setting_of_every_process_is_documented() -> None:
    """Each variable any process reads appears in a settings table, including group ids."""
    text = "".join(p.read_text() for p in reference.DOCS)
    for name in (
        "INORDER_RELAY_GROUP_ID",
        "INORDER_SWEEPER_GROUP_ID",
        "INORDER_TOPIC_PARTITIONS",
        "INORDER_GAUGE_INTERVAL_S",
        "INORDER_POLL_TIMEOUT_MS",
        "INORDER_PAYLOAD_SCHEMAS",
    ):
        assert f"| `{name}` |" in text


def test_alerts_link_to_their_runbook_entry_from_each_document() -> None:
    """Every alert row links to a runbook heading that exists, relative to its document."""
    runbook = (ROOT / "deploy" / "runbook.md").read_text().lower()
    for path in (ROOT / "README.md", ROOT / "deploy" / "README.md"):
        table = reference.alerts_table(path)
        links = re.findall(r"\]\(([^)#]+)#([a-z]+)\)", table)
        alerts = (ROOT / "deploy" / "prometheus" / "rules.yml").read_text().count("- alert:")
        assert len(links) == alerts
        for target, anchor in links:
            assert (path.parent / target).resolve() == ROOT / "deploy" / "runbook.md"
            assert f"## {anchor}\n" in runbook


def test_every_route_kind_documents_each_setting_it_reads() -> None:
    """The routes-file table has a row per setting each kind's parser accepts."""
    table = reference.route_settings_table()
    for name in ("table", "entity_type_column", "max_parked", "idempotent", "on_incomplete"):
        assert f"`{name}`" in table


def test_the_services_listen_on_ports_of_their_own() -> None:
    """Relay, consumer and sweeper default to distinct ports, so they can share a host."""
    table = reference.processes_table()
    ports = [row.rsplit("|", 2)[1].strip() for row in table.splitlines()[2:]]
    services = [p for p in ports if p != "none"]
    assert len(services) == len(set(services)) == 3


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


def test_unknown_block_in_a_document_is_refused() -> None:
    """A generated block with no renderer is an error, not silently left as it is."""
    text = (ROOT / "README.md").read_text() + "<!-- generated: nothing -->\n<!-- end: nothing -->"
    with pytest.raises(reference.ReferenceError, match="'nothing'"):
        reference.render(text)


def test_a_programs_table_shows_the_defaults_it_overrides() -> None:
    """The sweeper's table lists its own port though the field comes from the routes' settings."""
    from consumer.settings import RouteSettings, SweeperSettings  # noqa: PLC0415

    table = reference.settings_table(SweeperSettings, (RouteSettings,))
    assert "| `INORDER_HTTP_PORT` | 9402 |" in table
    assert "INORDER_ROUTES_FILE" not in table  # inherited unchanged: in the consumer's table
