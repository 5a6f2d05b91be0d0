"""Batch manifests in PostgreSQL: one row per batch, one per position, results that came early.

Every change to a batch happens under that batch's advisory lock (``lock``), taken for
all batches of a transaction at once in one global order, so consumers, the sweeper
and ``inorder-admin`` never deadlock on each other.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from consumer.kinds.batches.decisions import Batch, Item, Key, Manifest, Result, Snapshot
from schemas.batches import BatchStatus, ItemState

Created = tuple[Manifest, str, str | None]  # manifest, digest, why it cannot be used
Status = tuple[str, str | None, int | None]  # status, reason, revision after an assembly
# A result kept for a manifest not come yet: batch, event id, attempt, type, payload and
# its envelope (None for results kept before envelopes were).
Early = tuple[str, str, int, str, Any, bytes | None]

_LOCK = """
SELECT pg_advisory_xact_lock(k)
FROM (SELECT DISTINCT hashtextextended(%s || ':' || b, 0) AS k FROM unnest(%s::text[]) AS b) AS s
ORDER BY k
"""
# Rows are found by one primary-key lookup per key, whatever the tables' statistics: a
# lateral subquery with OFFSET is never merged into a join, and writes go through the
# primary key (ON CONFLICT). A join or ``= ANY(...)`` is planned by cost, and a plan
# prepared while the tables were small kept reading every row of the route as they grew:
# 100,000 item rows read for one batch of five results at 20,000 items.
_BATCHES = """
SELECT r.* FROM unnest(%s::text[]) AS k(batch_id)
CROSS JOIN LATERAL (
    SELECT batch_id, generation, expected_count, digest, on_incomplete, status, revision,
           deadline_s
    FROM inorder_batches WHERE route = %s AND batch_id = k.batch_id OFFSET 0) AS r
"""
_ALL_ITEMS = """
SELECT position, item_key, state, result_ref, attempts, error, finished_at
FROM inorder_batch_items WHERE route = %s AND batch_id = %s ORDER BY position
"""
_ROWS_OF = """
SELECT k.batch_id, i.* FROM unnest(%s::text[]) AS k(batch_id)
CROSS JOIN LATERAL (
    SELECT position, item_key, state, result_ref, attempts, error, finished_at
    FROM inorder_batch_items WHERE route = %s AND batch_id = k.batch_id
    ORDER BY position OFFSET 0) AS i
"""
_ITEMS = """
SELECT i.* FROM unnest(%s::text[], %s::int[]) AS t(batch_id, position)
CROSS JOIN LATERAL (
    SELECT batch_id, position, item_key, state, result_ref, attempts, error, finished_at, input
    FROM inorder_batch_items
    WHERE route = %s AND batch_id = t.batch_id AND position = t.position OFFSET 0) AS i
"""
_WRITE_ITEMS = """
INSERT INTO inorder_batch_items AS i (route, batch_id, position, item_key, state, result_ref,
                                      attempts, error, finished_at)
SELECT %s, t.batch_id, t.position, t.item_key, t.state, t.result_ref, t.attempts, t.error,
       t.finished_at
FROM unnest(%s::text[], %s::int[], %s::text[], %s::text[], %s::text[], %s::int[], %s::text[],
            %s::text[])
     AS t(batch_id, position, item_key, state, result_ref, attempts, error, finished_at)
CROSS JOIN LATERAL (
    SELECT FROM inorder_batch_items
    WHERE route = %s AND batch_id = t.batch_id AND position = t.position OFFSET 0) AS found
ON CONFLICT (route, batch_id, position) DO UPDATE
SET state = excluded.state, result_ref = excluded.result_ref, attempts = excluded.attempts,
    error = excluded.error, finished_at = excluded.finished_at, updated_at = now()
"""
_COUNTS = """
SELECT k.batch_id, i.state, count(*)
FROM (SELECT DISTINCT batch_id FROM unnest(%s::text[]) AS batch_id) AS k
CROSS JOIN LATERAL (
    SELECT state FROM inorder_batch_items WHERE route = %s AND batch_id = k.batch_id
    OFFSET 0) AS i
GROUP BY k.batch_id, i.state
"""
_INSERT_BATCH = """
INSERT INTO inorder_batches (route, batch_id, generation, expected_count, digest, on_incomplete,
                             deadline_s, deadline_at, status, reason)
VALUES (%s, %s, %s, %s, %s, %s, %s, now() + make_interval(secs => %s), %s, %s)
"""
_INSERT_ITEMS = """
INSERT INTO inorder_batch_items (route, batch_id, position, item_key, input)
SELECT %s, %s, t.position, t.item_key, t.input
FROM unnest(%s::int[], %s::text[], %s::jsonb[]) AS t(position, item_key, input)
"""


class BatchStore:
    """The tables of one batch route."""

    def __init__(self, route: str) -> None:
        self.route = route

    def lock(self, conn: psycopg.Connection[Any], batch_ids: Iterable[str]) -> None:
        """Take every named batch's lock until the transaction ends, in one global order."""
        ids = sorted(set(batch_ids))
        if ids:
            conn.execute(_LOCK, (self.route, ids))

    def batches(self, conn: psycopg.Connection[Any], batch_ids: Iterable[str]) -> dict[str, Batch]:
        """The rows of the named batches that exist."""
        rows = conn.execute(_BATCHES, (sorted(set(batch_ids)), self.route)).fetchall()
        return {row[0]: Batch(*row) for row in rows}

    def create(
        self, conn: psycopg.Connection[Any], manifest: Manifest, digest: str, problem: str | None
    ) -> None:
        """Store a new manifest; one that contradicts itself is stored flagged, without rows."""
        m = manifest
        conn.execute(
            _INSERT_BATCH,
            (
                self.route,
                m.batch_id,
                m.generation,
                m.expected_count,
                digest,
                m.on_incomplete,
                m.deadline_s,
                m.deadline_s,
                BatchStatus.INCONSISTENT if problem else BatchStatus.WAITING,
                problem,
            ),
        )
        if problem is None and m.items:
            conn.execute(
                _INSERT_ITEMS,
                (
                    self.route,
                    m.batch_id,
                    [i[0] for i in m.items],
                    [i[1] for i in m.items],
                    [Jsonb(i[2]) if i[2] else None for i in m.items],
                ),
            )

    def load(
        self,
        conn: psycopg.Connection[Any],
        batch_ids: Iterable[str],
        keys: Iterable[Key] = (),
        *,
        take_early: Sequence[str] = (),
    ) -> Snapshot:
        """Lock the batches and read what deciding over them needs, in a few statements.

        ``keys`` are the positions results name (read with their worker input);
        ``take_early`` the batches whose manifest arrives, whose kept results are taken.
        """
        ids = sorted(set(batch_ids))
        if not ids:
            return Snapshot({})
        self.lock(conn, ids)
        pairs = sorted(set(keys))
        rows: dict[Key, Item] = {}
        inputs: dict[Key, Any] = {}
        if pairs:
            found = conn.execute(
                _ITEMS, ([b for b, _ in pairs], [p for _, p in pairs], self.route)
            ).fetchall()
            for row in found:
                rows[row[0], row[1]] = Item(*row[1:-1])
                inputs[row[0], row[1]] = row[-1] or {}
        return Snapshot(
            self.batches(conn, ids),
            rows,
            inputs,
            self.counts(conn, ids),
            self.take_early(conn, take_early),
        )

    def rows_of(
        self, conn: psycopg.Connection[Any], batch_ids: Iterable[str]
    ) -> dict[str, list[Item]]:
        """Every position of each named batch, in position order."""
        out: dict[str, list[Item]] = defaultdict(list)
        for row in conn.execute(_ROWS_OF, (sorted(set(batch_ids)), self.route)):
            out[row[0]].append(Item(*row[1:]))
        return out

    def write(
        self,
        conn: psycopg.Connection[Any],
        *,
        created: Sequence[Created] = (),
        items: Mapping[Key, Item] | None = None,
        early: Sequence[Early] = (),
        statuses: Mapping[str, Status] | None = None,
    ) -> None:
        """Write what a transaction decided: new manifests, then rows, kept results, statuses."""
        for manifest, digest, problem in created:
            self.create(conn, manifest, digest, problem)
        self.write_items(conn, sorted((items or {}).items()))
        self.keep_early(conn, early)
        if statuses:
            with conn.cursor() as cur:
                cur.executemany(
                    "UPDATE inorder_batches SET status = %s, reason = %s, "
                    "revision = coalesce(%s, revision), updated_at = now() "
                    "WHERE route = %s AND batch_id = %s",
                    [(*change, self.route, b) for b, change in sorted(statuses.items())],
                )

    def all_items(self, conn: psycopg.Connection[Any], batch_id: str) -> list[Item]:
        """Every position of a batch, in position order."""
        rows = conn.execute(_ALL_ITEMS, (self.route, batch_id)).fetchall()
        return [Item(*row) for row in rows]

    def write_items(self, conn: psycopg.Connection[Any], rows: Sequence[tuple[Key, Item]]) -> None:
        """Write the new state of the given positions (which exist), in one statement."""
        if not rows:
            return
        columns: list[list[Any]] = [[] for _ in range(8)]
        for (batch_id, _), item in rows:
            values = (
                batch_id,
                item.position,
                item.item_key,
                item.state,
                item.result_ref,
                item.attempts,
                item.error,
                item.finished_at,
            )
            for column, value in zip(columns, values, strict=True):
                column.append(value)
        conn.execute(_WRITE_ITEMS, (self.route, *columns, self.route))

    def counts(
        self, conn: psycopg.Connection[Any], batch_ids: Iterable[str]
    ) -> dict[str, dict[str, int]]:
        """How many positions of each batch are in each state."""
        rows = conn.execute(_COUNTS, (sorted(set(batch_ids)), self.route)).fetchall()
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for batch_id, state, count in rows:
            out[batch_id][state] = count
        return out

    def extend_deadline(self, conn: psycopg.Connection[Any], batch_id: str) -> None:
        """Give a batch its full wait again from now (after a person dispatched a retry)."""
        conn.execute(
            "UPDATE inorder_batches SET deadline_at = greatest(deadline_at, "
            "now() + make_interval(secs => deadline_s)) WHERE route = %s AND batch_id = %s",
            (self.route, batch_id),
        )

    def keep_early(self, conn: psycopg.Connection[Any], rows: Sequence[Early]) -> None:
        """Keep results of batches with no manifest yet, each with its envelope."""
        if not rows:
            return
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO inorder_batch_early_results "
                "(route, batch_id, event_id, attempt, event_type, payload, message) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [(self.route, b, e, a, t, Jsonb(p), m) for b, e, a, t, p, m in rows],
            )

    def early_held(self, conn: psycopg.Connection[Any]) -> tuple[int, int]:
        """How many results the route keeps for manifests not come yet, and their bytes."""
        row = conn.execute(
            "SELECT count(*), coalesce(sum(coalesce(octet_length(message),"
            " pg_column_size(payload))), 0) FROM inorder_batch_early_results WHERE route = %s",
            (self.route,),
        ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def take_early(self, conn: psycopg.Connection[Any], batch_ids: Sequence[str]) -> list[Result]:
        """Remove and return the kept results of batches whose manifest just arrived."""
        if not batch_ids:
            return []
        rows = conn.execute(
            "DELETE FROM inorder_batch_early_results WHERE route = %s AND batch_id = ANY(%s) "
            "RETURNING attempt, event_type, payload",
            (self.route, list(batch_ids)),
        ).fetchall()
        return [Result.from_payload(a, t.endswith("succeeded"), p) for a, t, p in rows]

    def expire_early(self, conn: psycopg.Connection[Any], ttl_s: float, limit: int) -> list[Early]:
        """Remove and return up to ``limit`` kept results older than ``ttl_s``, oldest first."""
        return [
            (b, e, a, t, p, None if m is None else bytes(m))
            for b, e, a, t, p, m in conn.execute(
                "DELETE FROM inorder_batch_early_results AS r USING ("
                " SELECT batch_id, event_id FROM inorder_batch_early_results"
                " WHERE route = %(r)s AND received_at < now() - make_interval(secs => %(ttl)s)"
                " ORDER BY received_at LIMIT %(n)s FOR UPDATE SKIP LOCKED) AS old"
                " WHERE r.route = %(r)s AND r.batch_id = old.batch_id"
                " AND r.event_id = old.event_id"
                " RETURNING r.batch_id, r.event_id, r.attempt, r.event_type, r.payload, r.message",
                {"r": self.route, "ttl": ttl_s, "n": limit},
            ).fetchall()
        ]

    def overdue(self, conn: psycopg.Connection[Any], limit: int) -> list[str]:
        """Waiting batches past their deadline, oldest deadline first."""
        rows = conn.execute(
            "SELECT batch_id FROM inorder_batches WHERE route = %s AND status = %s "
            "AND deadline_at < now() ORDER BY deadline_at LIMIT %s",
            (self.route, BatchStatus.WAITING, limit),
        ).fetchall()
        return [row[0] for row in rows]

    def abandon_pending(self, conn: psycopg.Connection[Any], batch_ids: Sequence[str]) -> int:
        """Turn the pending positions of overdue waiting batches into abandoned ones."""
        cur = conn.execute(
            "UPDATE inorder_batch_items AS i SET state = %s, updated_at = now() "
            "FROM inorder_batches AS b "
            "WHERE b.route = %s AND b.batch_id = ANY(%s) AND b.status = %s "
            "AND b.deadline_at < now() AND i.route = b.route AND i.batch_id = b.batch_id "
            "AND i.state = %s",
            (
                ItemState.ABANDONED,
                self.route,
                list(batch_ids),
                BatchStatus.WAITING,
                ItemState.PENDING,
            ),
        )
        return cur.rowcount

    def record_action(
        self,
        conn: psycopg.Connection[Any],
        batch_id: str,
        position: int | None,
        action: str,
        by: str,
        reason: str,
    ) -> None:
        """Keep an operator's decision about a batch, with who and why."""
        conn.execute(
            "INSERT INTO inorder_batch_actions "
            "(route, batch_id, position, action, done_by, reason) VALUES (%s, %s, %s, %s, %s, %s)",
            (self.route, batch_id, position, action, by, reason),
        )
