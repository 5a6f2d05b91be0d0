"""Outbox rows as the relay reads them, for the tests of what it makes of a row."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from outbox_relay.rows import OutboxRow

# The publishing time the tests give the relay, as the JSON text it takes.
NOW = orjson.dumps(datetime(2026, 11, 30, 12, 0, tzinfo=UTC).isoformat()).decode()
PAYLOAD = {"plan": "pro", "price_cents": 2900, "status": "active"}


def outbox_row(**changes: Any) -> OutboxRow:
    """A subscription's row (seq 5 of generation 2, one header of its own), with ``changes``."""
    fields: dict[str, Any] = {
        "id": 7,
        "topic": "events",
        "entity_type": "subscription",
        "entity_id": "s1",
        "generation": 2,
        "seq": 5,
        "event_type": "subscription.plan_changed",
        "event_id": "subscription:s1:2:5",
        "payload": orjson.dumps(PAYLOAD).decode(),
        "headers": {"trace": "t"},
        "occurred_at": '"2026-11-30T11:59:00+00:00"',
        "slice": 3,
        "xid": 1000,
    }
    return OutboxRow(**{**fields, **changes})
