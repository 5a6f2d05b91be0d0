"""A producer in any language can write the outbox with plain SQL (psql here, no Python)."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime

import orjson

import schemas
from producer import migrate
from schemas.runtime.payloads import default_payload_schemas
from tests.conftest import PgSchema
from tests.support.docs import PRODUCER, example

# The statement producer/README.md shows for producers in other languages.
PLAIN_SQL = example("plain-sql", PRODUCER)


def test_row_written_with_psql_meets_the_contract(pg_schema: PgSchema) -> None:
    """A version bump and outbox insert done in psql yields an envelope the codec accepts."""
    with pg_schema.connect(autocommit=True) as conn:
        migrate.apply(conn, (migrate.OUTBOX, migrate.EXAMPLE))
        conn.execute(
            "INSERT INTO subscriptions (id, plan, price_cents, version) "
            "VALUES ('sql-1', 'pro', 2900, 4)"
        )
    subprocess.run(
        ["psql", pg_schema.conninfo, "-v", "ON_ERROR_STOP=1", "-q"],
        input=PLAIN_SQL,
        text=True,
        check=True,
        capture_output=True,
    )

    with pg_schema.connect() as conn:
        row = conn.execute(
            "SELECT event_id, event_type, entity_type, entity_id, generation, seq, created_at, "
            "payload FROM outbox"
        ).fetchone()
    assert row is not None
    event_id, event_type, entity_type, entity_id, generation, seq, created_at, payload = row
    envelope = {
        "event_id": event_id,
        "event_type": event_type,
        "entity_type": entity_type,
        "entity_id": entity_id,
        "generation": generation,
        "seq": seq,
        "occurred_at": created_at.isoformat(),
        "published_at": datetime.now(UTC).isoformat(),
        "payload": payload,
    }
    event = schemas.decode(orjson.dumps(envelope))
    default_payload_schemas().validate(event.event_type, event.payload)
    assert (event.entity_id, event.version, event.event_id) == (
        "sql-1",
        (1, 5),
        "subscription:sql-1:1:5",
    )
