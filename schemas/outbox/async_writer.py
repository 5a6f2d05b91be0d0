"""``emit_async``: ``emit`` for a psycopg ``AsyncConnection``, inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import PipelineStatus, TransactionStatus

from schemas import PayloadSchemas
from schemas.outbox.events import OutboxEvent, checked, duplicate_of
from schemas.outbox.writer import refuse_outside, statement
from schemas.runtime import cursors


async def emit_many_async(
    conn: psycopg.AsyncConnection[Any],
    events: Iterable[OutboxEvent],
    *,
    schemas: PayloadSchemas | None = None,
) -> None:
    """Write events in the caller's open transaction, as ``emit_many`` does; never commits."""
    if conn.pgconn.pipeline_status != PipelineStatus.OFF:
        async with conn.pipeline():  # learn the transaction state as of now
            pass
    status = conn.info.transaction_status
    if status == TransactionStatus.ACTIVE:  # another task's statement is under way
        async with conn.lock:
            status = conn.info.transaction_status
    refuse_outside(status)
    batch = checked(events, schemas)
    if not batch:
        return
    try:
        await cursors.kept(conn, conn.cursor_factory).execute(*statement(batch))
    except pg_errors.UniqueViolation as exc:
        raise duplicate_of(exc) or exc from exc


async def emit_async(
    conn: psycopg.AsyncConnection[Any],
    event: OutboxEvent,
    *,
    schemas: PayloadSchemas | None = None,
) -> None:
    """Write one event in the caller's open transaction."""
    await emit_many_async(conn, (event,), schemas=schemas)
