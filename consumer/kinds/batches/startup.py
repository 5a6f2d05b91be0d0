"""The batch kind's start-up check: a relay publishes the consumer's own outbox."""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg
import structlog

if TYPE_CHECKING:
    from consumer.kinds._resources import Resources
    from consumer.settings import RouteSettings

log = structlog.get_logger(__name__)


def check(resources: Resources[RouteSettings]) -> None:
    """Warn once when no relay holds a slice of the consumer's own outbox.

    A batch route's assembled output and re-dispatched work go through that outbox; with
    no relay on it they wait there, and nothing else would say why.
    """
    try:
        row = resources.conn.execute(
            "SELECT count(*) FROM outbox_relay_slices "
            "WHERE lease_until > now() - interval '1 minute'"
        ).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        log.info("outbox_relay_unknown", hint="grant SELECT on outbox_relay_slices to know")
        return
    except psycopg.errors.UndefinedTable:  # no relay has ever run on this database
        row = None
    if not row or not row[0]:
        log.warning(
            "outbox_relay_not_seen",
            hint="batch routes write to the outbox in DATABASE_URL: run inorder-relay on it",
        )
