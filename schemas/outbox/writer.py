"""``emit``: write events to the outbox in the caller's psycopg transaction, never committing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import PipelineStatus, TransactionStatus

from schemas import PayloadSchemas
from schemas.errors import NotInTransactionError
from schemas.outbox.events import (
    INSERT_RECORDS,
    INSERT_TEXT,
    OutboxEvent,
    checked,
    duplicate_of,
    records,
    values,
)
from schemas.runtime import cursors


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
    status = conn.info.transaction_status
    if status == TransactionStatus.ACTIVE:
        # Another thread's statement on this connection is under way: once it is
        # answered, the state is the transaction's again.
        with conn.lock:
            status = conn.info.transaction_status
    refuse_outside(status)


def statement(batch: list[OutboxEvent]) -> tuple[str, Any]:
    """The one statement that writes ``batch`` and its parameters.

    One event goes as one row's values; more go as one JSON array of rows, so a batch
    of any size is one statement, prepared once and run once.
    """
    if len(batch) == 1:
        return INSERT_TEXT, values(batch[0])
    return INSERT_RECORDS, (records(batch),)


def emit_many(
    conn: psycopg.Connection[Any],
    events: Iterable[OutboxEvent],
    *,
    schemas: PayloadSchemas | None = None,
) -> None:
    """Write events to the outbox in the caller's open transaction, in one statement.

    Each event is checked against the envelope and its payload schema first. The
    transaction stays the caller's: this never commits or rolls back.
    """
    _require_transaction(conn)
    batch = checked(events, schemas)
    if not batch:
        return
    try:
        # One cursor of the connection's own kind, kept on it: nothing reads its results.
        cursors.kept(conn, conn.cursor_factory).execute(*statement(batch))
    except pg_errors.UniqueViolation as exc:
        raise duplicate_of(exc) or exc from exc


def emit(
    conn: psycopg.Connection[Any], event: OutboxEvent, *, schemas: PayloadSchemas | None = None
) -> None:
    """Write one event to the outbox in the caller's open transaction."""
    emit_many(conn, (event,), schemas=schemas)
