"""The relay's SQL: claim, mark, look up ranges, measure the backlog, purge. Thin I/O only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row

from outbox_relay.errors import SchemaNotReadyError
from outbox_relay.rows import COLUMNS, OutboxRow

Conn = psycopg.Connection[Any]

_CLAIM = f"""
SELECT {COLUMNS} FROM outbox
 WHERE published_at IS NULL AND failed_at IS NULL
 ORDER BY id
 LIMIT %s
 FOR UPDATE SKIP LOCKED
"""  # noqa: S608 - COLUMNS is a constant, values are parameters

_RANGE = f"""
SELECT {COLUMNS}, failed_at IS NOT NULL AS failed FROM outbox
 WHERE entity_type = %s AND entity_id = %s AND generation = %s AND seq BETWEEN %s AND %s
 ORDER BY seq
"""  # noqa: S608 - COLUMNS is a constant, values are parameters


@dataclass(frozen=True, slots=True)
class Backlog:
    """Rows waiting to be published, the age of the oldest, and rows marked failed."""

    rows: int
    oldest_age_s: float
    failed: int


def check_schema(conn: Conn) -> None:
    """Raise ``SchemaNotReadyError`` unless the outbox has the columns the relay uses."""
    found = conn.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'outbox' "
        "AND table_schema = current_schema() AND column_name IN ('failed_at', 'failure_reason')"
    ).fetchone()
    if found is None or found[0] != 2:
        raise SchemaNotReadyError(
            "the outbox table is missing or out of date; run `inorder-producer migrate`"
        )


def claim(conn: Conn, limit: int) -> list[OutboxRow]:
    """Lock up to ``limit`` pending rows in id order, skipping rows other relays hold."""
    with conn.cursor(row_factory=class_row(OutboxRow)) as cur:
        return cur.execute(_CLAIM, (limit,)).fetchall()


def mark_published(conn: Conn, row_ids: Sequence[int]) -> None:
    """Record delivery: set published_at once, count every send."""
    if row_ids:
        conn.execute(
            "UPDATE outbox SET published_at = coalesce(published_at, now()), "
            "publish_count = publish_count + 1 WHERE id = ANY(%s)",
            (list(row_ids),),
        )


def mark_failed(conn: Conn, row_id: int, reason: str) -> None:
    """Take a row that cannot be sent out of the queue, keeping why."""
    conn.execute(
        "UPDATE outbox SET failed_at = now(), failure_reason = %s WHERE id = %s", (reason, row_id)
    )


def rows_in_range(
    conn: Conn, entity_type: str, entity_id: str, generation: int, from_seq: int, to_seq: int
) -> tuple[list[OutboxRow], list[int]]:
    """Rows of one entity generation with seq in the range: sendable rows and failed seqs."""
    rows: list[OutboxRow] = []
    failed: list[int] = []
    result = conn.execute(_RANGE, (entity_type, entity_id, generation, from_seq, to_seq))
    for record in result:
        if record[-1]:
            failed.append(record[5])
        else:
            rows.append(OutboxRow(*record[:-1]))
    return rows, failed


def backlog(conn: Conn) -> Backlog:
    """How far behind publishing is."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE failed_at IS NULL), "
        "coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE failed_at IS NULL)),"
        " 0), "
        "count(*) FILTER (WHERE failed_at IS NOT NULL) "
        "FROM outbox WHERE published_at IS NULL"
    ).fetchone()
    assert row is not None  # an aggregate always returns a row
    return Backlog(int(row[0]), float(row[1]), int(row[2]))


def purge_batch(conn: Conn, retention_s: float, limit: int) -> int:
    """Delete up to ``limit`` of the oldest rows published longer ago than ``retention_s``."""
    cur = conn.execute(
        "DELETE FROM outbox WHERE id IN ("
        " SELECT id FROM outbox"
        " WHERE published_at < now() - make_interval(secs => %s)"
        " ORDER BY published_at LIMIT %s FOR UPDATE SKIP LOCKED)",
        (retention_s, limit),
    )
    return cur.rowcount
