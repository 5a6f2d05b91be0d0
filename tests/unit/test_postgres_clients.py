"""Every PostgreSQL connection the programs open comes from one factory, named and bounded."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from schemas.runtime import postgres
from tests.support.services import ROOT

PACKAGES = ("schemas", "producer", "outbox_relay", "consumer")
FACTORY = ROOT / "schemas" / "runtime" / "postgres.py"


def test_a_plain_url_gets_the_name_the_timeout_and_keepalives() -> None:
    """Nothing in the URL: the program's name and every default are added."""
    added = postgres.parameters("postgresql://u@db:5432/app", "inorder-relay")
    options = added.pop("options")
    assert added == {**postgres.DEFAULTS, "application_name": "inorder-relay"}
    assert options.split(" -c ") == [
        f"{'-c ' if i == 0 else ''}{name}={value}"
        for i, (name, value) in enumerate(postgres.SERVER_DEFAULTS.items())
    ]


@pytest.mark.parametrize(
    "options",
    [
        "-c statement_timeout=0",
        "-cstatement_timeout=0",
        "--statement_timeout=0",
        "-c search_path=a -c statement_timeout=5s",
        "-c  statement_timeout = 0",
    ],
)
def test_a_server_setting_the_url_s_options_name_is_not_added_again(options: str) -> None:
    """Each way libpq's options can spell a setting counts as the operator's own."""
    merged = postgres.server_options(options)
    assert merged.startswith(options)
    assert merged.count("statement_timeout") == 1
    assert "lock_timeout=30s" in merged


def test_pgoptions_wins_and_the_caller_s_options_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """PGOPTIONS, libpq's own, sets a server default; the caller's search path stays first."""
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=2s")
    added = postgres.parameters("postgresql://db/app", "inorder-sweeper", "-c search_path=x")
    assert added["options"].startswith("-c search_path=x ")
    assert "lock_timeout" not in added["options"]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@db/app?application_name=billing&connect_timeout=3&keepalives_idle=5",
        "host=db dbname=app application_name=billing connect_timeout=3 keepalives_idle=5",
    ],
)
def test_what_the_url_sets_wins(url: str) -> None:
    """A value the operator put in the URL, in either form, is never overridden."""
    added = postgres.parameters(url, "inorder-consumer")
    assert not {"application_name", "connect_timeout", "keepalives_idle"} & set(added)
    assert added["keepalives"] == "1"


def test_libpq_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """PGAPPNAME and PGCONNECT_TIMEOUT, libpq's own, are left to libpq."""
    monkeypatch.setenv("PGAPPNAME", "ops")
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    added = postgres.parameters("postgresql://db/app", "inorder-sweeper")
    assert "application_name" not in added
    assert "connect_timeout" not in added


def test_a_url_libpq_cannot_read_adds_nothing() -> None:
    """An unreadable URL is left whole for the connection to report, never rewritten."""
    assert postgres.parameters("host=db port", "inorder-admin") == {}


def _connects(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = getattr(node.func.value, "id", None)
            if node.func.attr == "connect" and owner in {"psycopg", "AsyncConnection"}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_program_opens_postgresql_by_hand() -> None:
    """Connections are opened only by the factory, so each is named and bounded."""
    by_hand = [
        where
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != FACTORY
        for where in _connects(path)
    ]
    assert by_hand == []
    assert _connects(FACTORY), "the factory itself connects"
