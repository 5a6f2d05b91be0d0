"""Outbox rows and the Kafka messages made from them: pure, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox_relay.errors import RowProblem
from schemas import Event, PayloadError, PayloadSchemas, encode, headers

# The columns every query of rows selects, in OutboxRow's order.
COLUMNS = (
    "id, topic, entity_type, entity_id, generation, seq, event_type, event_id, payload, "
    "headers, created_at"
)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One outbox row as the relay reads it."""

    id: int
    topic: str
    entity_type: str
    entity_id: str
    generation: int
    seq: int
    event_type: str
    event_id: str
    payload: Any
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


def _event(row: OutboxRow, published_at: str) -> Event:
    # The table's CHECK constraints already hold every envelope field to the contract.
    if not isinstance(row.payload, Mapping):
        raise RowProblem("bad_payload", "payload must be a JSON object")
    return Event(
        event_id=row.event_id,
        event_type=row.event_type,
        entity_type=row.entity_type,
        entity_id=row.entity_id,
        generation=row.generation,
        seq=row.seq,
        occurred_at=row.created_at.isoformat(),
        published_at=published_at,
        payload=row.payload,
    )


def to_message(
    row: OutboxRow,
    published_at: str,
    *,
    schemas: PayloadSchemas,
    max_bytes: int,
    republish_request: str | None = None,
) -> Message:
    """The Kafka message for ``row``, or ``RowProblem`` saying why it cannot be sent.

    A payload is checked against its event type's schema when one is registered;
    event types without a schema pass unchecked.
    """
    event = _event(row, published_at)
    if row.event_type in schemas:
        try:
            schemas.validate(row.event_type, row.payload)
        except PayloadError as exc:
            raise RowProblem("payload_schema", exc.detail) from exc
    value = encode(event)
    if len(value) > max_bytes:
        raise RowProblem("too_large", f"message is {len(value)} bytes, over {max_bytes}")
    return Message(row.id, row.topic, event.key, value, _headers(row, republish_request))
