"""Your own event types: one schema folder and one unknown-type policy, for emit and the relay."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

import schemas
from producer import InvalidEventError, OutboxEvent, emit
from schemas.runtime.payloads import default_payload_schemas
from tests.conftest import PgSchema
from tests.integration import relay_support as rs
from tests.support.docs import example
from tests.support.kafka import drain, wait_until
from tests.support.services import Services

ORDER = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["total_cents"],
    "properties": {"total_cents": {"type": "integer", "minimum": 0}},
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A schema folder holding the application's order.created."""
    (tmp_path / "order.created.schema.json").write_bytes(orjson.dumps(ORDER))
    return tmp_path


@pytest.fixture
def environment(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """INORDER_PAYLOAD_SCHEMAS names the folder; emit's registry is read afresh."""
    monkeypatch.setenv("INORDER_PAYLOAD_SCHEMAS", str(folder))
    monkeypatch.delenv("INORDER_UNKNOWN_EVENT_TYPES", raising=False)
    default_payload_schemas.cache_clear()
    yield
    default_payload_schemas.cache_clear()


def _order(seq: int, payload: dict[str, object], event_type: str = "order.created") -> OutboxEvent:
    return OutboxEvent("order", "o-1", seq, event_type, payload)


def test_emit_checks_an_own_type_against_the_folder(outbox: PgSchema, environment: None) -> None:
    """emit writes an own type whose payload matches, refuses one that does not, and no row."""
    with outbox.connect() as conn, conn.transaction():
        emit(conn, _order(1, {"total_cents": 1200}))
        with pytest.raises(InvalidEventError, match="total_cents"):
            emit(conn, _order(2, {"total_cents": -1}))
    with outbox.connect() as conn:
        rows = conn.execute("SELECT event_type, payload FROM outbox").fetchall()
    assert rows == [("order.created", {"total_cents": 1200})]


def test_emit_refuses_a_type_without_a_schema_naming_the_setting(
    outbox: PgSchema, environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a schema file the type is refused, naming the file to add; allowed, it is written."""
    with (
        outbox.connect() as conn,
        conn.transaction(),
        pytest.raises(InvalidEventError, match=r"order\.shipped\.schema\.json.*PAYLOAD_SCHEMAS"),
    ):
        emit(conn, _order(1, {}, "order.shipped"))
    monkeypatch.setenv("INORDER_UNKNOWN_EVENT_TYPES", "allow")
    default_payload_schemas.cache_clear()
    with outbox.connect() as conn, conn.transaction():
        emit(conn, _order(1, {"anything": True}, "order.shipped"))


def _insert(schema: PgSchema, topic: str, rows: list[tuple[int, str, str]]) -> None:
    """Rows written by plain SQL, as a producer in another language would."""
    with schema.connect(autocommit=True) as conn:
        for seq, event_type, payload in rows:
            conn.execute(
                "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id,"
                " payload) VALUES (%s, 'order', 'o-1', %s, %s, %s, %s::jsonb)",
                (topic, seq, event_type, f"o-1:{seq}", payload),
            )


def _failed(schema: PgSchema) -> dict[int, str]:
    with schema.connect() as conn:
        rows = conn.execute(
            "SELECT seq, failure_reason FROM outbox WHERE failed_at IS NOT NULL"
        ).fetchall()
    return {seq: reason.split(":")[0] for seq, reason in rows}


@pytest.mark.parametrize("policy", ["refuse", "allow"])
def test_the_relay_holds_rows_to_the_same_folder_and_policy(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, folder: Path, policy: str
) -> None:
    """The relay sends a matching own type, fails a mismatch, and an unknown type per policy."""
    _insert(
        outbox,
        topics.events,
        [
            (1, "order.created", '{"total_cents": 5}'),
            (2, "order.created", '{"total_cents": "5"}'),
            (3, "order.shipped", '{"carrier": "x"}'),
        ],
    )
    settings = rs.settings_for(
        outbox,
        services.kafka_bootstrap,
        topics,
        payload_schemas=folder,
        unknown_event_types=policy,
    )
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0)
    expected_failed = {2: "payload_schema"} | ({3: "unknown_type"} if policy == "refuse" else {})
    assert _failed(outbox) == expected_failed
    sent = [
        m.value()
        for m in drain(services.kafka_bootstrap, topics.events, expect=3 - len(expected_failed))
    ]
    assert [schemas.decode(v).seq for v in sent] == sorted({1, 2, 3} - set(expected_failed))


def _start(program: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    base.update(
        DATABASE_URL="postgresql://x@127.0.0.1:1/x",
        KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1",
        REDIS_URL="redis://127.0.0.1:1/0",
        INORDER_ROUTES_FILE=str(Path(__file__).parents[2] / "deploy" / "k8s" / "routes.toml"),
    )
    module = {"inorder-relay": "outbox_relay"}.get(program, "consumer")
    argv = [sys.executable, "-c", f"import {module}.__main__ as m; m.{_ENTRY[program]}()"]
    return subprocess.run(
        argv, env={**base, **env}, capture_output=True, text=True, timeout=60, check=False
    )


_ENTRY = {
    "inorder-relay": "main",
    "inorder-consumer": "main",
    "inorder-sweeper": "sweeper_main",
}


@pytest.mark.parametrize("program", sorted(_ENTRY))
def test_a_bad_schema_file_stops_start_up_with_one_line(program: str, tmp_path: Path) -> None:
    """Every service refuses a schema folder it cannot use, naming the file, before connecting."""
    (tmp_path / "order.created.schema.json").write_text('{"type": "objekt"}')
    done = _start(program, INORDER_PAYLOAD_SCHEMAS=str(tmp_path))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(
        f"{program}: bad configuration: {tmp_path / 'order.created.schema.json'}"
    )
    assert "not a valid JSON Schema" in line


def test_the_readme_example_emits_an_own_type(
    outbox: PgSchema, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's schema file and emit block run as shown, and write the row."""
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "order.created.schema.json").write_text(example("own-type-schema"))
    with outbox.connect(autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE orders (id text PRIMARY KEY, total_cents bigint NOT NULL,"
            " version bigint NOT NULL DEFAULT 1)"
        )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INORDER_PAYLOAD_SCHEMAS", "schemas")
    monkeypatch.setenv("DATABASE_URL", outbox.url)
    default_payload_schemas.cache_clear()
    try:
        exec(compile(example("own-type-emit"), "README.md", "exec"), {})  # noqa: S102
    finally:
        default_payload_schemas.cache_clear()
    with outbox.connect() as conn:
        row = conn.execute("SELECT entity_id, seq, event_type, payload FROM outbox").fetchone()
    assert row == ("o-2", 1, "order.created", {"total_cents": 1200})
