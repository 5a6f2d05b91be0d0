"""Outbox rows and the Kafka messages made from them: pure, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson

from outbox_relay.errors import RowProblem
from schemas import PayloadError, PayloadSchemas, encode_rendered, headers, kafka_key

# The columns every query of rows selects, in OutboxRow's order. The payload and the
# creation time come as JSON text and go into the envelope as they are; the payload is
# parsed only when a schema checks it. Empty headers (the usual case) come as NULL.
COLUMNS = (
    "id, topic, entity_type, entity_id, generation, seq, event_type, event_id, payload::text, "
    "nullif(headers, '{}'::jsonb), to_json(created_at)::text"
)


class OutboxRow(NamedTuple):
    """One outbox row as the relay reads it (a tuple: rows are built by the ten thousand).

    ``payload`` is the JSON text of an object, ``occurred_at`` the JSON text of the
    creation time (a quoted timestamp), ``headers`` None when the row has none.
    """

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
    occurred_at: str


class Message(NamedTuple):
    """What goes to Kafka for one row."""

    row_id: int
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, str | bytes | None]]


def _headers(row: OutboxRow, republish_request: str | None) -> list[tuple[str, str | bytes | None]]:
    out: list[tuple[str, str | bytes | None]] = [
        (headers.EVENT_TYPE, row.event_type),
        (headers.ENTITY_TYPE, row.entity_type),
    ]
    if row.headers is not None:
        if not isinstance(row.headers, Mapping) or not all(
            isinstance(v, str) for v in row.headers.values()
        ):
            raise RowProblem("bad_headers", "headers must be a JSON object of strings")
        out.extend(row.headers.items())
    if republish_request is not None:
        out.append((headers.REPUBLISH_REQUEST, republish_request))
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

    ``published_at`` is JSON text (a quoted timestamp). The table's CHECK constraints
    already hold every envelope field to the contract and the payload to a JSON object;
    a payload is checked against its event type's schema when one is registered, and
    event types without one pass unchecked.
    """
    _check_payload(row, schemas)
    value = encode_rendered(
        row.event_id,
        row.event_type,
        (row.entity_type, row.entity_id, row.generation, row.seq),
        row.occurred_at,
        published_at,
        row.payload,
    )
    if len(value) > max_bytes:
        raise RowProblem("too_large", f"message is {len(value)} bytes, over {max_bytes}")
    key = kafka_key(row.entity_type, row.entity_id)
    return Message(row.id, row.topic, key, value, _headers(row, republish_request))
