"""``emit``: write events to the outbox in the caller's psycopg transaction, never committing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.types.json import Jsonb

from schemas import PayloadSchemas
from schemas.errors import NotInTransactionError
from schemas.outbox.events import INSERT, OutboxEvent, checked, duplicate_of, identity


def refuse_outside(status: TransactionStatus) -> None:
    """Raise ``NotInTransactionError`` unless a psycopg connection is in a transaction."""
    if status != TransactionStatus.INTRANS:
        raise NotInTransactionError(
            f"emit needs an open transaction holding the state change (status {status.name}); "
            "wrap the change and the emit in `with conn.transaction():`"
        )


def _require_transaction(conn: psycopg.Connection[Any]) -> None:
    if conn.pgconn.pipeline_status != PipelineStatus.OFF:
        # In a pipeline libpq knows the transaction state only as of the last sync with
        # the server (a BEGIN sent since then may still read as idle): sync to learn it.
        with conn.pipeline():
            pass
    refuse_outside(conn.info.transaction_status)


def row(event: OutboxEvent) -> tuple[Any, ...]:
    """The row's values as psycopg binds them (payload and headers as jsonb)."""
    return (*identity(event), Jsonb(event.payload), Jsonb(dict(event.headers)))


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
    batch = checked(events, schemas)
    try:
        with conn.cursor() as cur:
            if len(batch) == 1:  # one round trip without executemany's pipeline set-up
                cur.execute(INSERT, row(batch[0]))
            else:
                cur.executemany(INSERT, [row(e) for e in batch])
    except pg_errors.UniqueViolation as exc:
        raise duplicate_of(exc) or exc from exc


def emit(
    conn: psycopg.Connection[Any], event: OutboxEvent, *, schemas: PayloadSchemas | None = None
) -> None:
    """Write one event to the outbox in the caller's open transaction."""
    emit_many(conn, (event,), schemas=schemas)
