"""Gaps: seqs an entity waits for past the deadline. The range is a pure decision; the rest is SQL.

A gap is open from detection until its range is applied (healed), the relay says the
seqs are gone (unrecoverable, the entity is held), or a person skips it (skipped).
At most one unresolved gap per (route, entity).
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import psycopg
from psycopg.rows import class_row

from consumer.kinds.steps.plan import Progress
from schemas import Event
from schemas.republish import RepublishResult
from schemas.snapshot import snapshot_type

Conn = psycopg.Connection[Any]


class GapStatus(enum.StrEnum):
    """Where a gap stands (``inorder_gaps.status``)."""

    OPEN = "open"
    REQUESTED = "requested"
    HEALED = "healed"
    UNRECOVERABLE = "unrecoverable"
    SKIPPED = "skipped"


# At most one of these per (route, entity): the partial unique index names the same three.
UNRESOLVED = [GapStatus.OPEN, GapStatus.REQUESTED, GapStatus.UNRECOVERABLE]


@dataclass(frozen=True, slots=True)
class Gap:
    """One gap as stored."""

    id: int
    route: str
    entity_id: str
    generation: int
    from_seq: int
    to_seq: int
    event_type: str
    status: str
    first_seen: datetime
    attempts: int
    next_attempt_at: datetime
    missing: list[int] | None
    resolved_at: datetime | None
    resolved_by: str | None
    reason: str | None
    # The traceparent of the last republish request, and of the relay's last answer.
    request_trace: str | None = None
    answer_trace: str | None = None
    # The ids of the republish requests it sent, oldest first.
    request_ids: list[str] = field(default_factory=list)


_COLUMNS = (
    "id, route, entity_id, generation, from_seq, to_seq, event_type, status, first_seen, "
    "attempts, next_attempt_at, missing, resolved_at, resolved_by, reason, "
    "request_trace, answer_trace, request_ids"
)


def missing_range(progress: Progress, first_parked: Event) -> tuple[int, int, int] | None:
    """``(generation, from_seq, to_seq)`` an entity waits for, or None if nothing is missing."""
    if first_parked.generation == progress.generation:
        start = progress.last_applied + 1
    elif first_parked.generation > progress.generation:
        start = 1
    else:
        return None
    if start > first_parked.seq - 1:
        return None
    return first_parked.generation, start, first_parked.seq - 1


def request_id(gap: Gap) -> str:
    """The id of the gap's next request: its gap and attempt, and 128 random bits."""
    return f"gap-{gap.id}-{gap.attempts + 1}-{uuid.uuid4().hex}"


def answers(gap: Gap | None, result: RepublishResult) -> bool:
    """Whether ``result`` answers a request ``gap`` sent, for the generation it waits on.

    A gap opened before requests were recorded is matched by the id's form alone.
    """
    if gap is None or gap.resolved_at is not None or result.generation != gap.generation:
        return False
    if gap.request_ids:
        return result.request_id in gap.request_ids
    return result.request_id.startswith(f"gap-{gap.id}-")


def healed(gap: Gap, progress: Progress) -> bool:
    """True once the entity has applied past the gap (or moved to a newer generation)."""
    if progress.generation != gap.generation:
        return progress.generation > gap.generation
    return progress.last_applied >= gap.to_seq


def passed(conn: Conn, route: str, most: int) -> list[Gap]:
    """Up to ``most`` unresolved gaps of ``route`` whose entity has applied past them (or
    moved to a newer generation), oldest first: found by the database, so a sweep reads
    the gaps it can resolve, not every gap still open."""
    with conn.cursor(row_factory=class_row(Gap)) as cur:
        return cur.execute(
            f"SELECT {_COLUMNS} FROM inorder_gaps g WHERE status = ANY(%s) "  # noqa: S608
            "AND route = %s AND EXISTS (SELECT 1 FROM inorder_step_progress p "
            "WHERE p.route = g.route AND p.entity_id = g.entity_id "
            "AND (p.generation > g.generation OR (p.generation = g.generation "
            "AND p.last_applied >= g.to_seq))) ORDER BY first_seen LIMIT %s",
            (UNRESOLVED, route, most),
        ).fetchall()


def listing(conn: Conn, status: str | None, limit: int) -> list[Gap]:
    """Gaps, newest first, optionally of one status."""
    with conn.cursor(row_factory=class_row(Gap)) as cur:
        return cur.execute(
            f"SELECT {_COLUMNS} FROM inorder_gaps WHERE (%s::text IS NULL OR status = %s) "  # noqa: S608
            "ORDER BY id DESC LIMIT %s",
            (status, status, limit),
        ).fetchall()


def get(conn: Conn, gap_id: int) -> Gap | None:
    """One gap by id."""
    with conn.cursor(row_factory=class_row(Gap)) as cur:
        query = f"SELECT {_COLUMNS} FROM inorder_gaps WHERE id = %s"  # noqa: S608
        return cur.execute(query, (gap_id,)).fetchone()


def of_entity(conn: Conn, route: str, entity_id: str) -> list[Gap]:
    """Every gap an entity ever had, oldest first."""
    with conn.cursor(row_factory=class_row(Gap)) as cur:
        return cur.execute(
            f"SELECT {_COLUMNS} FROM inorder_gaps WHERE route = %s AND entity_id = %s "  # noqa: S608
            "ORDER BY id",
            (route, entity_id),
        ).fetchall()


def find(conn: Conn, route: str, entity_id: str) -> Gap | None:
    """The entity's unresolved gap, if any."""
    with conn.cursor(row_factory=class_row(Gap)) as cur:
        return cur.execute(
            f"SELECT {_COLUMNS} FROM inorder_gaps WHERE route = %s AND entity_id = %s "  # noqa: S608
            "AND status = ANY(%s)",
            (route, entity_id, UNRESOLVED),
        ).fetchone()


def open_gap(
    conn: Conn, route: str, entity_id: str, span: tuple[int, int, int], event_type: str
) -> bool:
    """Record a newly seen gap; False if the entity already has an unresolved one."""
    row = conn.execute(
        "INSERT INTO inorder_gaps (route, entity_id, generation, from_seq, to_seq, event_type, "
        "status) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id",
        (route, entity_id, *span, event_type, GapStatus.OPEN),
    ).fetchone()
    return row is not None


def clock(conn: Conn) -> datetime:
    """PostgreSQL's clock, the one every gap time is written with (never a process's own)."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return cast(datetime, row[0])


def requested(conn: Conn, gap: Gap, request: str, delay_s: float, trace: str | None = None) -> bool:
    """Claim the gap's next republish request, record its id and say when the next is due.

    Only the sweeper that read the gap's current attempt count claims it: a sweeper that
    froze after reading the gap and woke after another took the lease and asked finds the
    count moved and sends nothing (False). ``trace``: the request's span.
    """
    row = conn.execute(
        "UPDATE inorder_gaps SET status = %s, attempts = attempts + 1, "
        "next_attempt_at = now() + make_interval(secs => %s), "
        "request_trace = coalesce(%s, request_trace), "
        "request_ids = array_append(request_ids, %s) "
        "WHERE id = %s AND attempts = %s AND resolved_at IS NULL RETURNING 1",
        (GapStatus.REQUESTED, delay_s, trace, request, gap.id, gap.attempts),
    ).fetchone()
    return row is not None


def answered(conn: Conn, gap: Gap, trace: str) -> None:
    """Remember the trace context of the relay's answer to the gap's request."""
    conn.execute("UPDATE inorder_gaps SET answer_trace = %s WHERE id = %s", (trace, gap.id))


def resolve(
    conn: Conn, gap: Gap, status: GapStatus, by: str, reason: str, missing: list[int] | None = None
) -> bool:
    """Close a gap as healed or skipped, or mark it unrecoverable, saying who and why.

    An unrecoverable gap stays unresolved (no ``resolved_at``): it waits for a person.
    The change is made only if the gap is still as the caller read it (unresolved, in
    the status read): a person's skip and the sweeper's heal may meet on one gap, and
    the one that comes second is told so (False) instead of writing over the first.
    """
    resolved = status != GapStatus.UNRECOVERABLE
    changed = conn.execute(
        "UPDATE inorder_gaps SET status = %s, resolved_at = CASE WHEN %s THEN now() END, "
        "resolved_by = %s, reason = %s, missing = coalesce(%s, missing) "
        "WHERE id = %s AND status = %s AND resolved_at IS NULL",
        (status, resolved, by, reason, missing, gap.id, gap.status),
    )
    return changed.rowcount == 1


def move(conn: Conn, gap: Gap, span: tuple[int, int, int]) -> None:
    """The entity now waits for ``(generation, from_seq, to_seq)`` instead."""
    conn.execute(
        "UPDATE inorder_gaps SET generation = %s, from_seq = %s, to_seq = %s WHERE id = %s",
        (*span, gap.id),
    )


def narrow(conn: Conn, gap: Gap, from_seq: int) -> None:
    """A person skipped the start of the gap: it now begins at ``from_seq``."""
    conn.execute("UPDATE inorder_gaps SET from_seq = %s WHERE id = %s", (from_seq, gap.id))


def status_counts(conn: Conn) -> dict[str, int]:
    """Number of gaps per status."""
    rows = conn.execute("SELECT status, count(*) FROM inorder_gaps GROUP BY status").fetchall()
    return {status: int(count) for status, count in rows}


def passed_by_snapshot(conn: Conn, gap: Gap) -> int | None:
    """The seq of a snapshot the entity took as its baseline past the gap's start, if any."""
    row = conn.execute(
        "SELECT min(seq) FROM inorder_step_log WHERE route = %s AND entity_id = %s "
        "AND generation = %s AND seq >= %s AND event_type = %s",
        (gap.route, gap.entity_id, gap.generation, gap.from_seq, snapshot_type(gap.route)),
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])
