"""Ordered steps, the PostgreSQL side: every statement a step route runs, in one place.

Progress rows are locked in entity order first, so two consumers racing on an
entity take turns, and each run of steps is claimed with a conditional update:
zero rows means someone else applied it, and nothing runs. The operator's
decisions (skip, confirm, retry, release) are statements here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import orjson
import psycopg

from consumer.kinds.steps.plan import Progress
from consumer.kinds.steps.route import StepRoute
from consumer.kinds.steps.transaction import Sync
from schemas import Event
from schemas.limits import safe_text

Conn = psycopg.Connection[Any]
Query = tuple[str, Any]  # a statement and its parameters, for a connection of either kind


def _json(rows: Any) -> str:
    """Statement input as one JSON text: far cheaper to send than several arrays."""
    return orjson.dumps(rows).decode()


# One step applied alone, logged.
_LOG_STEP = (
    "INSERT INTO inorder_step_log (route, entity_id, generation, seq, event_id, event_type) "
    "VALUES (%(r)s, %(e)s, %(g)s, %(s)s, %(i)s, %(t)s)"
)
# The same, finishing the step's external call's attempt in the same statement.
_LOG_CALLED = (
    "WITH done AS (UPDATE inorder_step_attempts SET completed_at = now() "
    "WHERE route = %(r)s AND entity_id = %(e)s AND generation = %(g)s AND seq = %(s)s) "
    "INSERT INTO inorder_step_log (route, entity_id, generation, seq, event_id, event_type) "
    "VALUES (%(r)s, %(e)s, %(g)s, %(s)s, %(i)s, %(t)s)"
)
# Claims advance each progress row through the primary key, whatever the table's
# statistics: a per-row lookup checks that the row is still at its start (a subquery with
# OFFSET is never merged into a join), and ON CONFLICT updates it through the same index.
# An UPDATE joining the claims could be planned as a scan of the whole table, and a plan
# prepared while the table was small kept scanning it as it grew (4 ms a batch at 8,000
# entities). The rows exist (``lock`` made them), so nothing is inserted.
_CLAIM_MANY = (
    "WITH c AS (SELECT * FROM jsonb_to_recordset(%(claims)s::jsonb) "
    "AS c(e text, sg bigint, sl bigint, ng bigint, nl bigint)), "
    "u AS (INSERT INTO inorder_step_progress AS p (route, entity_id, generation, last_applied) "
    "SELECT %(route)s, c.e, c.ng, c.nl FROM c CROSS JOIN LATERAL ("
    "SELECT FROM inorder_step_progress WHERE route = %(route)s AND entity_id = c.e "
    "AND generation = c.sg AND last_applied = c.sl AND stopped_at_seq IS NULL OFFSET 0) AS due "
    "ON CONFLICT (route, entity_id) DO UPDATE SET generation = excluded.generation, "
    "last_applied = excluded.last_applied, updated_at = now() RETURNING p.entity_id) "
    "SELECT c.e FROM c WHERE NOT EXISTS (SELECT FROM u WHERE u.entity_id = c.e)"
)
# The same, where a claim that does not apply fails: the cast of its explanation to a
# number raises, and with it the statement and the transaction.
_ADVANCE_ALL = (
    "WITH c AS (SELECT * FROM jsonb_to_recordset(%(claims)s::jsonb) "
    "AS c(e text, sg bigint, sl bigint, ng bigint, nl bigint)) "
    "INSERT INTO inorder_step_progress AS p (route, entity_id, generation, last_applied) "
    "SELECT %(route)s, c.e, CASE WHEN due.ok THEN c.ng ELSE "
    "('inorder: the progress of ' || c.e || ' moved while it was locked')::bigint END, c.nl "
    "FROM c LEFT JOIN LATERAL (SELECT true AS ok FROM inorder_step_progress "
    "WHERE route = %(route)s AND entity_id = c.e "
    "AND generation = c.sg AND last_applied = c.sl AND stopped_at_seq IS NULL OFFSET 0) AS due "
    "ON true ON CONFLICT (route, entity_id) DO UPDATE SET generation = excluded.generation, "
    "last_applied = excluded.last_applied, updated_at = now()"
)


class StepStore:
    """PostgreSQL side of one step route."""

    def __init__(self, route: StepRoute) -> None:
        self.route = route
        # Set when other consumers apply this route's entities at the same moment (a
        # share group): an entity's one-by-one steps then run under its lock.
        self.shared = False

    def lock(
        self, conn: Conn, first_events: Mapping[str, Event], sync: Sync | None = None
    ) -> dict[str, Progress]:
        """Create missing progress rows, then lock all of them in entity order.

        Each entity's progress comes with its park mark, so a batch asks Redis for parked
        successors only of entities that parked something ahead of where they stand.
        In a pipelined transaction, ``sync`` is its sync: the rows are read through it.
        """
        firsts = _json([{"e": i, "g": first_events[i].generation} for i in sorted(first_events)])
        conn.execute(
            "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied) "
            "SELECT %s, e, g, 0 FROM jsonb_to_recordset(%s::jsonb) AS t(e text, g bigint) "
            "ON CONFLICT DO NOTHING",
            (self.route.stream, firsts),
        )
        # One index lookup per entity whatever the statistics say: a subquery that locks
        # is never merged into the join, so each runs as its own lookup, in entity order.
        # (Before its first ANALYZE a table growing from empty looks tiny, and a plain
        # ``entity_id = ANY(...)`` was planned as a scan of every row of the route.) The
        # ids come as JSON, not as an array: the planner sizes an array parameter exactly
        # for each call, so the statement was planned again at every batch (0.2 ms).
        locking = conn.execute(
            "SELECT p.* FROM (SELECT e FROM jsonb_to_recordset(%s::jsonb) AS t(e text) "
            "ORDER BY e) AS k CROSS JOIN LATERAL (SELECT entity_id, generation, last_applied, "
            " stopped_at_seq IS NOT NULL, parked_generation, parked_through "
            " FROM inorder_step_progress WHERE route = %s AND entity_id = k.e FOR UPDATE) AS p",
            (firsts, self.route.stream),
        )
        if sync is not None:
            sync()
        rows = locking.fetchall()
        return {
            row[0]: Progress(row[1], row[2], row[3], None if row[4] is None else (row[4], row[5]))
            for row in rows
        }

    def made(self, conn: Conn, event: Event) -> Progress:
        """One entity's progress with its park mark, its row made if missing; no lock.

        One statement (``made_query``): the row is inserted when missing, else read. For
        an entity applied alone, whose every step's claim checks the progress again, a
        lock held only for this read would cost a write and a commit for nothing.
        """
        with conn.transaction() if not conn.autocommit else nullcontext():
            row = conn.execute(*self.made_query(event)).fetchone()
        return self.made_from(conn, event, row)

    def made_query(self, event: Event) -> Query:
        """The statement ``made`` sends: a row of the entity's progress, made if missing
        (none when another transaction made it and this one cannot see it yet)."""
        return (
            "WITH ins AS (INSERT INTO inorder_step_progress "
            "(route, entity_id, generation, last_applied) VALUES (%(r)s, %(e)s, %(g)s, 0) "
            "ON CONFLICT DO NOTHING RETURNING generation, last_applied, false, "
            "NULL::bigint, NULL::bigint) "
            "SELECT * FROM ins UNION ALL SELECT generation, last_applied, "
            "stopped_at_seq IS NOT NULL, parked_generation, parked_through "
            "FROM inorder_step_progress WHERE route = %(r)s AND entity_id = %(e)s",
            {"r": self.route.stream, "e": event.entity_id, "g": event.generation},
        )

    def made_from(self, conn: Conn, event: Event, row: Any) -> Progress:
        """The progress ``made_query`` answered; its row read under a lock when none came
        (made meanwhile by another transaction, not yet in this one's snapshot)."""
        if row is None:
            with conn.transaction():
                return self.lock(conn, {event.entity_id: event})[event.entity_id]
        return self.made_row(row)

    @staticmethod
    def made_row(row: Any) -> Progress:
        """The progress in a row ``made_query`` answered."""
        return Progress(row[0], row[1], row[2], None if row[3] is None else (row[3], row[4]))

    def read(self, conn: Conn, entity_ids: Sequence[str]) -> dict[str, Progress]:
        """Progress of the given entities, without locking them."""
        # One lookup per entity, as in ``lock``: ``entity_id = ANY(...)`` was planned to read
        # every row of the route once its plan was cached over a small table.
        rows = conn.execute(
            "SELECT p.* FROM jsonb_array_elements_text(%s::jsonb) AS k(e) "
            "CROSS JOIN LATERAL (SELECT entity_id, generation, last_applied, "
            " stopped_at_seq IS NOT NULL FROM inorder_step_progress "
            " WHERE route = %s AND entity_id = k.e OFFSET 0) AS p",
            (_json(sorted(set(entity_ids))), self.route.stream),
        ).fetchall()
        return {row[0]: Progress(row[1], row[2], row[3]) for row in rows}

    def claim_one_query(self, entity_id: str, start: Progress, event: Event) -> Query:
        """Move an existing progress row from ``start`` to ``event``: a row if it moved.

        One statement, for a connection of either kind: the update locks the row and,
        should another transaction have moved it meanwhile, checks its condition again
        on the row that one left.
        """
        return (
            "UPDATE inorder_step_progress SET generation = %s, last_applied = %s, "
            "updated_at = now() WHERE route = %s AND entity_id = %s AND generation = %s "
            "AND last_applied = %s AND stopped_at_seq IS NULL RETURNING 1",
            (
                event.generation,
                event.seq,
                self.route.stream,
                entity_id,
                start.generation,
                start.last_applied,
            ),
        )

    def claim_many(self, conn: Conn, claims: Sequence[tuple[str, Progress, Progress]]) -> set[str]:
        """``claim`` for many entities in one statement; returns the entities claimed.

        The statement answers with the entities it could not claim (normally none),
        so a batch does not carry every claimed id back. Call it in the transaction that
        took the rows' locks (``lock``): no one else can move a row meanwhile.
        """
        if not claims:
            return set()
        rows = conn.execute(
            _CLAIM_MANY,
            self._claims(claims),
        ).fetchall()
        return {e for e, _, _ in claims} - {row[0] for row in rows}

    def advance(self, conn: Conn, claims: Sequence[tuple[str, Progress, Progress]]) -> None:
        """``claim_many`` where every claim must apply: one that does not fails the transaction.

        For the transaction that locked the rows and planned from what it read under the
        locks, where a claim cannot miss. Nothing is read back, so in a pipeline the
        claim goes with the steps' statements and the COMMIT, one round trip less. Should
        a claim miss all the same, the cast of the explanation to a number fails the
        statement, and with it the transaction, instead of applying steps twice.
        """
        if not claims:
            return
        conn.execute(
            _ADVANCE_ALL,
            self._claims(claims),
        )

    def _claims(self, claims: Sequence[tuple[str, Progress, Progress]]) -> dict[str, str]:
        rows = [
            {
                "e": e,
                "sg": s.generation,
                "sl": s.last_applied,
                "ng": n.generation,
                "nl": n.last_applied,
            }
            for e, s, n in claims
        ]
        return {"claims": _json(rows), "route": self.route.stream}

    def record(self, conn: Conn, applied: Sequence[Event]) -> None:
        """Write the step log of everything applied in this transaction, in one statement."""
        if applied:
            conn.execute(
                "INSERT INTO inorder_step_log (route, entity_id, generation, seq, event_id, "
                "event_type) SELECT %s, e, g, s, i, t FROM jsonb_to_recordset(%s::jsonb) "
                "AS r(e text, g bigint, s bigint, i text, t text)",
                (
                    self.route.stream,
                    _json(
                        [
                            {
                                "e": e.entity_id,
                                "g": e.generation,
                                "s": e.seq,
                                "i": e.event_id,
                                "t": e.event_type,
                            }
                            for e in applied
                        ]
                    ),
                ),
            )

    def stop(self, conn: Conn, entity_id: str, seq: int, reason: str) -> None:
        """Stop an entity before ``seq`` until a person looks at it."""
        conn.execute(
            "UPDATE inorder_step_progress SET stopped_at_seq = %s, stop_reason = %s, "
            "stopped_at = now(), retry_at = NULL, updated_at = now() "
            "WHERE route = %s AND entity_id = %s",
            (seq, safe_text(reason[:1000]), self.route.stream, entity_id),
        )

    def mark_parked(self, conn: Conn, early: Sequence[Event]) -> None:
        """Record in one statement the newest version each entity is about to park."""
        newest: dict[str, tuple[int, int]] = {}
        for event in early:
            newest[event.entity_id] = max(newest.get(event.entity_id, (0, 0)), event.version)
        self.mark(conn, newest)

    def mark(self, conn: Conn, newest: Mapping[str, tuple[int, int]]) -> None:
        """Raise each entity's park mark to ``(generation, seq)``; never lowers one."""
        if not newest:
            return
        # Through the primary key (ON CONFLICT), like the claims: never a table scan. The
        # rows exist (a batch made them); a missing one would be made as ``lock`` makes it.
        conn.execute(
            "INSERT INTO inorder_step_progress AS p (route, entity_id, generation, "
            "last_applied, parked_generation, parked_through) "
            "SELECT %s, m.e, m.g, 0, m.g, m.s "
            "FROM jsonb_to_recordset(%s::jsonb) AS m(e text, g bigint, s bigint) "
            "ON CONFLICT (route, entity_id) DO UPDATE SET "
            "parked_generation = excluded.parked_generation, "
            "parked_through = excluded.parked_through, updated_at = now() "
            "WHERE (coalesce(p.parked_generation, 0), coalesce(p.parked_through, 0)) "
            "< (excluded.parked_generation, excluded.parked_through)",
            (
                self.route.stream,
                _json([{"e": e, "g": g, "s": s} for e, (g, s) in newest.items()]),
            ),
        )

    def parked_ahead(
        self, conn: Conn, quiet_s: float, limit: int
    ) -> list[tuple[str, Progress, tuple[int, int]]]:
        """Entities whose parks are ahead of their progress and quiet for ``quiet_s``.

        Each with its progress and the newest version it parked, oldest first; held and
        stopped entities are left to a person.
        """
        rows = conn.execute(
            "SELECT entity_id, generation, last_applied, parked_generation, parked_through "
            "FROM inorder_step_progress WHERE route = %s "
            "AND (parked_generation, parked_through) > (generation, last_applied) "
            "AND updated_at < now() - make_interval(secs => %s) "
            "AND held_at IS NULL AND stopped_at_seq IS NULL ORDER BY updated_at LIMIT %s",
            (self.route.stream, quiet_s, limit),
        ).fetchall()
        return [(r[0], Progress(r[1], r[2]), (r[3], r[4])) for r in rows]

    def hold(self, conn: Conn, entity_id: str) -> bool:
        """Mark an entity held (parking cap reached); True if it was not held before."""
        found = conn.execute(
            "UPDATE inorder_step_progress SET held_at = now() WHERE route = %s AND entity_id = %s "
            "AND held_at IS NULL RETURNING 1",
            (self.route.stream, entity_id),
        ).fetchone()
        return found is not None

    def attempt_query(self, event: Event, standing: Progress | None = None) -> Query:
        """Record an external call before making it: a row back, unless an earlier one of
        the same step never finished. With ``standing``, only while the entity stands
        there, not stopped: for an opening sent before its progress was read (``made``)."""
        if standing is None:
            return (
                "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
                (self.route.stream, event.entity_id, event.generation, event.seq, event.event_id),
            )
        return (
            "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id) "
            "SELECT %(r)s, %(e)s, %(g)s, %(s)s, %(i)s WHERE EXISTS (SELECT FROM "
            "inorder_step_progress WHERE route = %(r)s AND entity_id = %(e)s AND generation "
            "= %(sg)s AND last_applied = %(sl)s AND stopped_at_seq IS NULL) "
            "ON CONFLICT DO NOTHING RETURNING 1",
            {
                "r": self.route.stream,
                "e": event.entity_id,
                "g": event.generation,
                "s": event.seq,
                "i": event.event_id,
                "sg": standing.generation,
                "sl": standing.last_applied,
            },
        )

    def logged_query(self, event: Event, *, called: bool) -> Query:
        """The statement logging one step (and, ``called``, finishing its call's attempt)."""
        return (
            _LOG_CALLED if called else _LOG_STEP,
            {
                "r": self.route.stream,
                "e": event.entity_id,
                "g": event.generation,
                "s": event.seq,
                "i": event.event_id,
                "t": event.event_type,
            },
        )

    def finish_attempt(self, conn: Conn, entity_id: str, generation: int, seq: int) -> None:
        """Mark an external call done, in the transaction that records its step."""
        conn.execute(
            "UPDATE inorder_step_attempts SET completed_at = now() WHERE route = %s "
            "AND entity_id = %s AND generation = %s AND seq = %s",
            (self.route.stream, entity_id, generation, seq),
        )

    # ------------------------------------------------------------ a person's decisions

    def locked(self, conn: Conn, entity_id: str) -> tuple[int, int, int | None] | None:
        """Lock and return (generation, last_applied, stopped_at_seq), or None if unknown."""
        row = conn.execute(
            "SELECT generation, last_applied, stopped_at_seq FROM inorder_step_progress "
            "WHERE route = %s AND entity_id = %s FOR UPDATE",
            (self.route.stream, entity_id),
        ).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def stopped_since(self, conn: Conn, entity_id: str) -> float | None:
        """When the entity was stopped for a person (seconds since the epoch; None: not known)."""
        row = conn.execute(
            "SELECT extract(epoch FROM stopped_at)::float8 FROM inorder_step_progress "
            "WHERE route = %s AND entity_id = %s",
            (self.route.stream, entity_id),
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def skip(
        self, conn: Conn, entity_id: str, skipped: tuple[int, int, int], by: str, reason: str
    ) -> None:
        """Advance past ``(generation, from_seq, through)``, which never comes; release a hold."""
        conn.execute(
            "UPDATE inorder_step_progress SET last_applied = %s, held_at = NULL, "
            "updated_at = now() WHERE route = %s AND entity_id = %s",
            (skipped[2], self.route.stream, entity_id),
        )
        self.note_skip(conn, entity_id, skipped, by, reason)

    def note_skip(
        self, conn: Conn, entity_id: str, skipped: tuple[int, int, int], by: str, reason: str
    ) -> None:
        """Record who skipped ``(generation, from_seq, through)`` and why."""
        generation, from_seq, through = skipped
        conn.execute(
            "INSERT INTO inorder_step_skips (route, entity_id, generation, from_seq, to_seq, "
            "skipped_by, reason) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (self.route.stream, entity_id, generation, from_seq, through, by, reason),
        )

    def confirm(self, conn: Conn, entity_id: str, generation: int, seq: int, by: str) -> None:
        """A person confirms the stopped external step took effect: it counts as applied."""
        self.finish_attempt(conn, entity_id, generation, seq)
        conn.execute(
            "UPDATE inorder_step_progress SET last_applied = %s "
            "WHERE route = %s AND entity_id = %s",
            (seq, self.route.stream, entity_id),
        )
        conn.execute(
            "INSERT INTO inorder_step_log (route, entity_id, generation, seq, event_id, "
            "event_type) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (
                self.route.stream,
                entity_id,
                generation,
                seq,
                f"confirmed-by:{by}",
                "(confirmed by a person)",
            ),
        )

    def resume(self, conn: Conn, entity_id: str, generation: int, seq: int) -> None:
        """A person lifts a stop: the step runs again, its failures counted afresh.

        An unfinished attempt at ``seq`` is forgotten so the call may be made again.
        """
        conn.execute(
            "DELETE FROM inorder_step_attempts WHERE route = %s AND entity_id = %s "
            "AND generation = %s AND seq = %s AND completed_at IS NULL",
            (self.route.stream, entity_id, generation, seq),
        )
        conn.execute(
            "UPDATE inorder_step_progress SET stopped_at_seq = NULL, stop_reason = NULL, "
            "stopped_at = NULL, retry_at = NULL, failures = 0, updated_at = now() "
            "WHERE route = %s AND entity_id = %s",
            (self.route.stream, entity_id),
        )

    def release(self, conn: Conn, entity_id: str) -> None:
        """Release a held entity (its held events were sent back)."""
        conn.execute(
            "UPDATE inorder_step_progress SET held_at = NULL WHERE route = %s AND entity_id = %s",
            (self.route.stream, entity_id),
        )

    def generation(self, conn: Conn, entity_id: str) -> int | None:
        """The entity's current generation, or None if nothing was applied yet."""
        row = conn.execute(
            "SELECT generation FROM inorder_step_progress WHERE route = %s AND entity_id = %s",
            (self.route.stream, entity_id),
        ).fetchone()
        return None if row is None else int(row[0])


# Over every step route: what a person is asked to look at.
HELD = (
    "SELECT route AS stream, entity_id AS entity, generation, last_applied, held_at "
    "FROM inorder_step_progress WHERE held_at IS NOT NULL ORDER BY held_at"
)
NEEDS_REVIEW = (
    "SELECT route AS stream, entity_id AS entity, generation, last_applied, "
    "stopped_at_seq AS stopped_at, stop_reason AS reason "
    "FROM inorder_step_progress WHERE stopped_at_seq IS NOT NULL AND retry_at IS NULL "
    "ORDER BY updated_at"
)
RETRYING = (
    "SELECT route AS stream, entity_id AS entity, generation, stopped_at_seq AS seq, "
    "failures, retry_at, stop_reason AS reason "
    "FROM inorder_step_progress WHERE retry_at IS NOT NULL ORDER BY retry_at"
)
