"""Outbox rows and the Kafka messages made from them: pure, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from outbox_relay.errors import RowProblem
from schemas import Event, PayloadError, PayloadSchemas, encode, headers

# The columns every query of rows selects, in OutboxRow's order. The payload comes as
# JSON text and goes into the envelope as it is, never parsed unless a schema checks it.
COLUMNS = (
    "id, topic, entity_type, entity_id, generation, seq, event_type, event_id, payload::text, "
    "headers, created_at"
)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One outbox row as the relay reads it (``payload`` is the JSON text of an object)."""

    id: int
    topic: str
    entity_type: str
    entity_id: str
    generation: int
    seq: int
    event_type: str
    event_id: str
    payload: str
    headers: Any
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Message:
    """What goes to Kafka for one row."""

    row_id: int
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, str | bytes | None]]


def _headers(row: OutboxRow, republish_request: str | None) -> list[tuple[str, str | bytes | None]]:
    if not isinstance(row.headers, Mapping) or not all(
        isinstance(v, str) for v in row.headers.values()
    ):
        raise RowProblem("bad_headers", "headers must be a JSON object of strings")
    out: list[tuple[str, str | bytes | None]] = [
        (headers.EVENT_TYPE, row.event_type.encode()),
        (headers.ENTITY_TYPE, row.entity_type.encode()),
    ]
    out.extend((name, value.encode()) for name, value in row.headers.items())
    if republish_request is not None:
        out.append((headers.REPUBLISH_REQUEST, republish_request.encode()))
    return out


def _check_payload(row: OutboxRow, schemas: PayloadSchemas) -> None:
    """Hold the payload to its event type's schema, when one is registered."""
    if row.event_type not in schemas:
        return
    try:
        schemas.validate(row.event_type, orjson.loads(row.payload))
    except PayloadError as exc:
        raise RowProblem("payload_schema", exc.detail) from exc


def to_message(
    row: OutboxRow,
    published_at: str,
    *,
    schemas: PayloadSchemas,
    max_bytes: int,
    republish_request: str | None = None,
) -> Message:
    """The Kafka message for ``row``, or ``RowProblem`` saying why it cannot be sent.

    The table's CHECK constraints already hold every envelope field to the contract
    and the payload to a JSON object; a payload is checked against its event type's
    schema when one is registered, and event types without one pass unchecked.
    """
    _check_payload(row, schemas)
    event = Event(
        event_id=row.event_id,
        event_type=row.event_type,
        entity_type=row.entity_type,
        entity_id=row.entity_id,
        generation=row.generation,
        seq=row.seq,
        occurred_at=row.created_at.isoformat(),
        published_at=published_at,
        payload={},
    )
    value = encode(event, payload_json=row.payload)
    if len(value) > max_bytes:
        raise RowProblem("too_large", f"message is {len(value)} bytes, over {max_bytes}")
    return Message(row.id, row.topic, event.key, value, _headers(row, republish_request))
