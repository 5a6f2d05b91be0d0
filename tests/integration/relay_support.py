"""Helpers for relay tests: write outbox rows, run relays in threads or as processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from outbox_relay.weighing import Bounds
from producer import OutboxEvent, emit_many, migrate
from schemas.runtime.health import Health
from tests.conftest import PgSchema
from tests.support.group_protocol import on_protocol
from tests.support.threads import serving

PAYLOAD = {"plan": "pro", "price_cents": 2900, "status": "active"}


@dataclass(frozen=True)
class RelayTopics:
    """The topics one relay test uses."""

    events: str
    requests: str
    results: str


def bounds(rows: int, total: int = 2**30, row_bytes: int = 2**20) -> Bounds:
    """Read bounds of ``rows`` per part, with a byte budget that binds only when given."""
    return Bounds(rows, total, row_bytes)


def prepare_outbox(schema: PgSchema) -> None:
    """Create the outbox table in the test's schema."""
    with schema.connect(autocommit=True) as conn:
        migrate.apply(conn)


def write_rows(
    schema: PgSchema, topic: str, count: int, *, entities: int = 10, start_seq: int = 1
) -> list[str]:
    """Commit ``count`` events spread over ``entities`` entities; return their event ids."""
    events = [
        OutboxEvent(
            "subscription",
            f"s{i % entities}",
            start_seq + i // entities,
            "subscription.plan_changed",
            PAYLOAD,
            topic=topic,
        )
        for i in range(count)
    ]
    with schema.connect() as conn:
        for start in range(0, len(events), 1000):
            with conn.transaction():
                emit_many(conn, events[start : start + 1000])
    return [e.resolved_event_id for e in events]


def count_rows(schema: PgSchema, where: str = "true") -> int:
    """Rows of the outbox matching a fixed SQL condition written by the test."""
    with schema.connect() as conn:
        row = conn.execute(f"SELECT count(*) FROM outbox WHERE {where}").fetchone()  # noqa: S608
    assert row is not None
    return int(row[0])


# A fixed SQL condition: rows the relay has not sent yet (rows marked failed excluded; rows
# set aside for their topic included: they are sent once it exists).
UNSENT = (
    "NOT outbox_published(outbox) AND (failed_at IS NULL OR failure_reason LIKE 'awaiting_topic:%')"
)
SENT = "outbox_published(outbox)"


def unsent(schema: PgSchema) -> int:
    """Rows still to be sent."""
    return count_rows(schema, UNSENT)


# The payload schemas of the event types the tests make up (each any JSON object).
TEST_SCHEMAS = Path(__file__).parents[1] / "payload_schemas"


def settings_for(
    schema: PgSchema, bootstrap: str, topics: RelayTopics, **overrides: Any
) -> RelaySettings:
    """Relay settings pointing at the test's schema and topics."""
    values: dict[str, Any] = {
        "DATABASE_URL": schema.url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "republish_requests_topic": topics.requests,
        "republish_results_topic": topics.results,
        "relay_group_id": f"relay-{uuid.uuid4().hex[:8]}",
        "create_topics": False,
        "http_port": 0,
        "delivery_timeout_ms": 10_000,
        "payload_schemas": TEST_SCHEMAS,
        **overrides,
    }
    return RelaySettings(**on_protocol(values, bootstrap, values["relay_group_id"]))


@contextmanager
def running(settings: RelaySettings, *, listen: bool = True) -> Iterator[Relay]:
    """A relay serving in a background thread until the block ends."""
    relay = Relay(settings, Health(), listen=listen)
    with serving("relay", relay.run, relay.stop):
        yield relay


def relay_env(settings: RelaySettings) -> dict[str, str]:
    """Environment for an ``inorder-relay`` process with the same settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    env.update(
        DATABASE_URL=settings.database_url.get_secret_value(),
        KAFKA_BOOTSTRAP_SERVERS=settings.kafka_bootstrap_servers,
        INORDER_REPUBLISH_REQUESTS_TOPIC=settings.republish_requests_topic,
        INORDER_REPUBLISH_RESULTS_TOPIC=settings.republish_results_topic,
        INORDER_RELAY_GROUP_ID=settings.relay_group_id,
        INORDER_CREATE_TOPICS="false",
        INORDER_READ_ROWS=str(settings.read_rows),
        INORDER_LEASE_S=str(settings.lease_s),
        INORDER_HTTP_PORT=str(settings.http_port),
        INORDER_UNKNOWN_EVENT_TYPES=settings.unknown_event_types,
    )
    if settings.payload_schemas is not None:
        env["INORDER_PAYLOAD_SCHEMAS"] = str(settings.payload_schemas)
    return env


def spawn(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``inorder-relay`` as its own process, its JSON log lines appended to ``log``."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "outbox_relay"], env=env, stdout=sink, stderr=sink
        )


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
