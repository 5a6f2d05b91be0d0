"""``inorder-admin explain``: one entity's whole story, from its outbox rows to what was applied.

Everything is read, nothing is changed: the outbox rows with whether each was sent or
failed, the projection row or the step progress and log, what is parked in Redis, held or
stopped for a person, the entity's gaps with their republish attempts, its dead letters,
and the audit run on this entity alone. ``verdict`` turns that into one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from itertools import groupby
from typing import Any

import psycopg
from psycopg.rows import dict_row

from consumer.admin.audit import Audit, Divergence
from consumer.kinds.projection import ProjectionRoute, stored_row
from consumer.kinds.steps import StepRoute
from consumer.kinds.steps.parking import ParkingLot
from consumer.routes import Route
from consumer.sweeper import gaps

Conn = psycopg.Connection[Any]
# More outbox rows than this are summarised by their count (the newest are shown).
MAX_OUTBOX_ROWS = 200


@dataclass(slots=True)
class Story:
    """What is known about one entity, section by section."""

    stream: str
    entity_id: str
    kind: str
    outbox_rows: int = 0
    outbox: list[dict[str, Any]] = field(default_factory=list)
    applied: dict[str, Any] | None = None
    step_log: list[dict[str, Any]] = field(default_factory=list)
    skips: list[dict[str, Any]] = field(default_factory=list)
    uncertain_calls: list[dict[str, Any]] = field(default_factory=list)
    parked: list[int] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def known(self) -> bool:
        """Whether either side has ever heard of the entity."""
        return bool(self.outbox_rows or self.applied or self.step_log or self.parked)

    def as_dict(self) -> dict[str, Any]:
        """Every section, plus the verdict, for --json."""
        return {**asdict(self), "verdict": verdict(self)}


def ranges(seqs: Iterable[int]) -> str:
    """``1..5, 7, 9..10`` for sorted seqs."""
    parts = []
    for _, run in groupby(enumerate(seqs), key=lambda pair: pair[1] - pair[0]):
        found = [seq for _, seq in run]
        parts.append(str(found[0]) if len(found) == 1 else f"{found[0]}..{found[-1]}")
    return ", ".join(parts)


def verdict(story: Story) -> str:
    """One line: consistent, behind for a known reason, or diverging for none."""
    unexplained = [d for d in story.divergences if d.cause is None]
    if unexplained:
        return "diverges, unexplained: " + "; ".join(d.detail for d in unexplained)
    if story.divergences:
        causes = dict.fromkeys(f"{d.detail} ({d.cause})" for d in story.divergences)
        return "behind, explained: " + "; ".join(causes)
    if story.parked:
        return f"consistent with the outbox; {len(story.parked)} event(s) parked"
    return "consistent with the outbox"


def _outbox(outbox: Conn, story: Story) -> None:
    with outbox.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT count(*) OVER () AS total, o.id, o.generation, o.seq, o.event_type, "
            "o.created_at, outbox_published(o) AS sent, o.failure_reason AS failed "
            "FROM outbox o WHERE o.entity_type = %s AND o.entity_id = %s "
            "ORDER BY o.generation DESC, o.seq DESC, o.id DESC LIMIT %s",
            (story.stream, story.entity_id, MAX_OUTBOX_ROWS),
        ).fetchall()
    story.outbox_rows = int(rows[0]["total"]) if rows else 0
    for row in rows:
        del row["total"]
    story.outbox = rows[::-1]


def _steps(conn: Conn, lot: ParkingLot | None, route: StepRoute, story: Story) -> None:
    key = (route.stream, story.entity_id)
    with conn.cursor(row_factory=dict_row) as cur:
        story.applied = cur.execute(
            "SELECT generation, last_applied, held_at, stopped_at_seq, stop_reason, updated_at "
            "FROM inorder_step_progress WHERE route = %s AND entity_id = %s",
            key,
        ).fetchone()
        logged = cur.execute(
            "SELECT generation, seq FROM inorder_step_log WHERE route = %s AND entity_id = %s "
            "ORDER BY generation, seq",
            key,
        ).fetchall()
        story.skips = cur.execute(
            "SELECT generation, from_seq, to_seq, skipped_by, reason, skipped_at "
            "FROM inorder_step_skips WHERE route = %s AND entity_id = %s ORDER BY skipped_at",
            key,
        ).fetchall()
        story.uncertain_calls = cur.execute(
            "SELECT generation, seq, event_id, started_at FROM inorder_step_attempts "
            "WHERE route = %s AND entity_id = %s AND completed_at IS NULL ORDER BY started_at",
            key,
        ).fetchall()
    for generation, rows in groupby(logged, key=lambda r: r["generation"]):
        story.step_log.append({"generation": generation, "applied": ranges(r["seq"] for r in rows)})
    if lot is not None:
        story.parked = lot.parked_seqs(route.stream, story.entity_id)


def gather(route: Route, entity_id: str, outbox: Conn, conn: Conn, lot: ParkingLot | None) -> Story:
    """Read every section of one entity's story (read-only, one statement per section)."""
    story = Story(route.stream, entity_id, route.kind)
    _outbox(outbox, story)
    if isinstance(route, ProjectionRoute):
        story.applied = stored_row(conn, route, entity_id)
    elif isinstance(route, StepRoute):
        _steps(conn, lot, route, story)
    story.gaps = [
        {
            "id": g.id,
            "status": g.status,
            "range": f"{g.generation}/{g.from_seq}..{g.to_seq}",
            "first_seen": g.first_seen,
            "requests": g.attempts,
            "resolved_by": g.resolved_by,
            "reason": g.reason,
        }
        for g in gaps.of_entity(conn, route.stream, entity_id)
    ]
    with conn.cursor(row_factory=dict_row) as cur:
        story.dead_letters = cur.execute(
            "SELECT generation, seq, reason, detail, recorded_at FROM inorder_dead_letters "
            "WHERE entity_type = %s AND entity_id = %s ORDER BY recorded_at",
            (route.stream, entity_id),
        ).fetchall()
    story.divergences = Audit(outbox, conn, only=entity_id).run([route]).divergences
    return story
