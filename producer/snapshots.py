"""Snapshots of a stream's entities: each entity's current row, written through the outbox.

For a table of the version-column pattern (``id``, ``generation``, ``version``), each
entity's row and its ``(generation, version)`` are read by the same statement that writes
its ``<stream>.snapshot`` event, with ``seq = version``: the event always carries the
state of exactly that version. The outbox refuses a second snapshot of one version, so
taking snapshots again writes only those of entities that changed since.

Rows are taken in ``id`` order, a chunk per transaction, paced to ``rate`` rows a second;
the payload is the row without its version columns, or what the ``payload`` SQL
expression makes of it (the row is ``t``). With ``requested``, only the entities a
consumer asked for (``outbox_snapshot_requests``, written by the sweeper) are taken, and
their requests are marked taken in the same statement.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from schemas.snapshot import snapshot_type

# Rows read and written per transaction.
CHUNK = 500
# The payload when none is given: the row's own columns.
ROW = "to_jsonb(t) - 'id' - 'generation' - 'version' - 'deleted'"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What to snapshot: the stream, its table and topic, and optional SQL of the operator's."""

    stream: str
    table: str
    topic: str
    payload: str = ROW
    where: str | None = None
    rate: float | None = None
    # Only entities a consumer asked for (``outbox_snapshot_requests``), marked taken.
    requested: bool = False


@dataclass(slots=True)
class Report:
    """What a snapshot did: entities read, snapshots written, and those already written."""

    read: int = 0
    written: int = 0
    # Requests of consumers the snapshots answered (``requested``).
    taken: int = 0

    @property
    def already(self) -> int:
        """Entities whose snapshot at their version was there already."""
        return self.read - self.written


def _statement(plan: Snapshot) -> sql.Composed:
    schema, _, name = plan.table.rpartition(".")
    table = sql.Identifier(schema, name) if schema else sql.Identifier(name)
    where = sql.SQL(plan.where) if plan.where else sql.SQL("true")  # the operator's own SQL
    asked = sql.SQL(_ASKED if plan.requested else "true")
    return sql.SQL(
        "WITH chunk AS (SELECT t.id::text AS id, t.generation, t.version, ({payload}) AS body "
        'FROM {table} AS t WHERE t.id::text COLLATE "C" > %(after)s AND ({where}) '
        'AND ({asked}) ORDER BY t.id::text COLLATE "C" LIMIT %(chunk)s), '
        "written AS (INSERT INTO outbox (topic, entity_type, entity_id, generation, seq, "
        "event_type, event_id, payload) "
        "SELECT %(topic)s, %(stream)s, id, generation, version, %(type)s, "
        "%(prefix)s || md5(id || ':' || generation || ':' || version), body FROM chunk "
        "ON CONFLICT DO NOTHING RETURNING 1), "
        "taken AS (UPDATE outbox_snapshot_requests SET taken_at = now() "
        "WHERE %(requested)s AND entity_type = %(stream)s AND taken_at IS NULL "
        "AND entity_id IN (SELECT id FROM chunk) RETURNING 1) "
        "SELECT (SELECT count(*) FROM chunk), (SELECT count(*) FROM written), "
        '(SELECT max(id COLLATE "C") FROM chunk), (SELECT count(*) FROM taken)'
    ).format(payload=sql.SQL(plan.payload), table=table, where=where, asked=asked)


_ASKED = (
    "t.id::text IN (SELECT entity_id FROM outbox_snapshot_requests "
    "WHERE entity_type = %(stream)s AND taken_at IS NULL)"
)


def take(
    conn: psycopg.Connection[Any],
    plan: Snapshot,
    progress: Callable[[int], None] = lambda _: None,
) -> Report:
    """Write a snapshot of every entity of ``plan.table`` the filter keeps; what was done."""
    statement = _statement(plan)
    params = {
        "topic": plan.topic,
        "stream": plan.stream,
        "type": snapshot_type(plan.stream),
        "prefix": f"snapshot-{uuid.uuid4().hex[:8]}-",
        "chunk": CHUNK,
        "after": "",
        "requested": plan.requested,
    }
    report = Report()
    began = time.monotonic()
    while True:
        with conn.transaction():
            row = conn.execute(statement, params).fetchone()
        read, written, last, taken = row if row is not None else (0, 0, None, 0)
        if not read:
            return report
        report.read += read
        report.written += written
        report.taken += taken
        params["after"] = last
        progress(read)
        if plan.rate:  # paced: the chunk's share of the time at the rate asked
            ahead = report.read / plan.rate - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)
