"""Asking the producer for a snapshot of an entity whose gap can no longer be republished.

The ask is a row in the outbox database's ``outbox_snapshot_requests`` (outbox migration
0004), which ``inorder-producer snapshot STREAM --requested`` takes: the consumer never
reads the producer's tables. An entity asked for already, and not yet taken, is not asked
again. The outbox database is ``INORDER_OUTBOX_DATABASE_URL``, else the consumer's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
import structlog

from schemas.runtime import postgres

if TYPE_CHECKING:
    from consumer.settings import SweeperSettings

log = structlog.get_logger(__name__)


class Asker:
    """Writes snapshot requests; its connection is opened at the first request."""

    def __init__(self, settings: SweeperSettings) -> None:
        self._url = settings.outbox_database_url or settings.database_url
        self._conn: psycopg.Connection[Any] | None = None

    def ask(self, stream: str, entity_id: str, reason: str) -> bool:
        """Request a snapshot of one entity; False when the outbox has no request table.

        An outage raises, as any outage of the sweeper's work does.
        """
        if self._conn is None or self._conn.closed:
            self._conn = postgres.connect(self._url, "inorder-sweeper")
        try:
            self._conn.execute(
                "INSERT INTO outbox_snapshot_requests (entity_type, entity_id, reason, "
                "requested_by) VALUES (%s, %s, %s, 'sweeper') ON CONFLICT DO NOTHING",
                (stream, entity_id, reason[:1000]),
            )
        except psycopg.errors.UndefinedTable:
            log.error(  # noqa: TRY400 - the fix is the whole message
                "snapshot_not_requested",
                route=stream,
                entity=entity_id,
                fix="run inorder-producer migrate on the outbox database (migration 0004)",
            )
            return False
        return True

    def close(self) -> None:
        """Close the connection, if one was opened."""
        if self._conn is not None:
            self._conn.close()
