"""Whether the relay keeps sent rows long enough for what a step route may still ask.

An event can wait parked for its route's ``park_ttl_s``; once its gap is found, the
sweeper may still ask the relay to re-send the missing rows for the worst-case repair
time after that. The relay purges sent rows after ``INORDER_RETENTION_S``, which each
live relay records in ``outbox_relays`` (outbox migration 0009). A retention shorter
than the longest park plus the repair time could purge rows a waiting park will need.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
import structlog
from pydantic import SecretStr

from schemas.runtime import postgres

Conn = psycopg.Connection[Any]
log = structlog.get_logger(__name__)


def shortfall(retentions: list[float], parks: Mapping[str, int], repair_s: float) -> str | None:
    """One line saying what to change when the shortest retention is too short, else None.

    ``parks``: each step route's park TTL. No relay has said its retention: None.
    """
    if not retentions or not parks:
        return None
    shortest = min(retentions)
    route, longest = max(parks.items(), key=lambda item: item[1])
    needed = longest + repair_s
    if shortest > needed:
        return None
    return (
        f"a relay keeps sent rows {shortest:g} s (INORDER_RETENTION_S), not longer than route "
        f"{route}'s park_ttl_s ({longest} s) plus the worst-case gap repair ({repair_s:g} s): "
        f"an event parked that long could need rows already purged; set INORDER_RETENTION_S "
        f"above {needed:g} on the relays, or lower park_ttl_s"
    )


def relay_retentions(conn: Conn) -> list[float]:
    """The retention each live relay records; none from an outbox not migrated to 0009."""
    try:
        with conn.transaction():
            rows = conn.execute(
                "SELECT retention_s FROM outbox_relays "
                "WHERE seen_until >= now() AND retention_s IS NOT NULL"
            ).fetchall()
    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
        return []
    return [float(row[0]) for row in rows]


class RetentionWatch:
    """Checks the relays' retention now and then; one line each time the verdict changes.

    The outbox database is ``INORDER_OUTBOX_DATABASE_URL``, else the sweeper's own (its
    connection is used then). An outage leaves the verdict as it was.
    """

    def __init__(self, own: Conn, outbox_url: SecretStr | None) -> None:
        self._own = own
        self._url = outbox_url
        self._conn: Conn | None = None
        self._said: str | None = None  # the last verdict logged
        self._refused = False  # the role may not read the relays' retention (said once)

    def check(self, parks: Mapping[str, int], repair_s: float) -> str | None:
        """The current shortfall (logged when it first shows, and when it is gone); while
        no live relay says its retention, the last verdict stands."""
        try:
            retentions = relay_retentions(self._outbox())
        except psycopg.errors.InsufficientPrivilege:
            if not self._refused:
                log.warning(
                    "retention_not_checked",
                    fix="grant SELECT ON outbox_relays to the sweeper's role",
                )
                self._refused = True
            return self._said
        except psycopg.OperationalError:
            return self._said
        if not retentions:  # no live relay has said: nothing new to know
            return self._said
        found = shortfall(retentions, parks, repair_s)
        if found != self._said:
            if found is not None:
                log.error("retention_shorter_than_parks", detail=found)
            else:  # it was short, and is no longer
                log.info("retention_outlives_parks")
            self._said = found
        return found

    def close(self) -> None:
        """Close the outbox connection, if one was opened."""
        if self._conn is not None:
            self._conn.close()

    def _outbox(self) -> Conn:
        if self._url is None:
            return self._own
        if self._conn is None or self._conn.closed:
            self._conn = postgres.connect(self._url, "inorder-sweeper")
        return self._conn
