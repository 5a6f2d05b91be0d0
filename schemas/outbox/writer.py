"""``emit``: write events to the outbox inside the caller's transaction, never committing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.types.json import Jsonb

from schemas import DEFAULT_TOPICS, PayloadError, PayloadSchemas, default_event_id
from schemas.codec import field_problem
from schemas.errors import DuplicateEventError, InvalidEventError, NotInTransactionError
from schemas.limits import MAX_DEPTH, MAX_PAYLOAD_DEPTH, value_problem
from schemas.validation import default_payload_schemas

_INSERT = """
INSERT INTO outbox (topic, entity_type, entity_id, generation, seq,
                    event_type, event_id, payload, headers)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
"""


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """One event to write: the entity, its version from this transaction, and the payload."""

    entity_type: str
    entity_id: str
    seq: int
    event_type: str
    payload: Mapping[str, Any]
    generation: int = 1
    topic: str = DEFAULT_TOPICS.events
    headers: Mapping[str, str] = field(default_factory=dict)
    event_id: str | None = None

    @property
    def resolved_event_id(self) -> str:
        """The event id, defaulting to ``entity_type:entity_id:generation:seq``."""
        return self.event_id or default_event_id(
            self.entity_type, self.entity_id, self.generation, self.seq
        )


def _require_transaction(conn: psycopg.Connection[Any]) -> None:
    if conn.pgconn.pipeline_status != PipelineStatus.OFF:
        # In a pipeline libpq knows the transaction state only as of the last sync with
        # the server (a BEGIN sent since then may still read as idle): sync to learn it.
        with conn.pipeline():
            pass
    status = conn.info.transaction_status
    if status != TransactionStatus.INTRANS:
        raise NotInTransactionError(
            f"emit needs an open transaction holding the state change (status {status.name}); "
            "wrap the change and the emit in `with conn.transaction():`"
        )


def _check(event: OutboxEvent, schemas: PayloadSchemas) -> None:
    for name in ("entity_type", "entity_id", "generation", "seq", "event_type"):
        problem = field_problem(name, getattr(event, name))
        if problem is not None:
            raise InvalidEventError(problem[1])
    problem = field_problem("event_id", event.resolved_event_id)
    if problem is not None:
        raise InvalidEventError(f"event_id {event.resolved_event_id!r}: {problem[1]}")
    for where, value, depth in (
        ("payload", event.payload, MAX_PAYLOAD_DEPTH),
        ("headers", event.headers, MAX_DEPTH),
    ):
        beyond = value_problem(value, depth, where=where)
        if beyond is not None:
            raise InvalidEventError(f"{beyond[1]} ({beyond[0]})")
    if not all(isinstance(v, str) for v in event.headers.values()):
        raise InvalidEventError("headers must map names to strings")
    try:
        schemas.validate(event.event_type, event.payload)
    except PayloadError as exc:
        raise InvalidEventError(str(exc)) from exc


def _row(event: OutboxEvent) -> tuple[Any, ...]:
    return (
        event.topic,
        event.entity_type,
        event.entity_id,
        event.generation,
        event.seq,
        event.event_type,
        event.resolved_event_id,
        Jsonb(event.payload),
        Jsonb(dict(event.headers)),
    )


def emit_many(
    conn: psycopg.Connection[Any],
    events: Iterable[OutboxEvent],
    *,
    schemas: PayloadSchemas | None = None,
) -> None:
    """Write events to the outbox in the caller's open transaction, in one round trip.

    Each event is checked against the envelope and its payload schema first. The
    transaction stays the caller's: this never commits or rolls back.
    """
    _require_transaction(conn)
    registry = schemas or default_payload_schemas()
    batch: Sequence[OutboxEvent] = list(events)
    for event in batch:
        _check(event, registry)
    try:
        with conn.cursor() as cur:
            if len(batch) == 1:  # one round trip without executemany's pipeline set-up
                cur.execute(_INSERT, _row(batch[0]))
            else:
                cur.executemany(_INSERT, [_row(e) for e in batch])
    except pg_errors.UniqueViolation as exc:
        raise _duplicate(exc) from exc


def emit(
    conn: psycopg.Connection[Any], event: OutboxEvent, *, schemas: PayloadSchemas | None = None
) -> None:
    """Write one event to the outbox in the caller's open transaction."""
    emit_many(conn, (event,), schemas=schemas)


def _duplicate(exc: pg_errors.UniqueViolation) -> DuplicateEventError:
    return DuplicateEventError(exc.diag.message_detail or str(exc), exc.diag.constraint_name)
