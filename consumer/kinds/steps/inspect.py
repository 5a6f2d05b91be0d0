"""A step route's part of ``inorder-admin``: its progress and log for ``explain``, its audit.

The audit: every outbox seq of an entity must be in the step log once, unless a person
skipped it or a snapshot the route took as its baseline moved the entity past it; a seq
missing is explained by the first known state that accounts for it (superseded
generation, failed or unpublished row, stopped for review, open gap, held, dead-lettered)
or left unexplained.
"""

from __future__ import annotations

from itertools import groupby
from typing import TYPE_CHECKING, Any

from psycopg import sql
from psycopg.rows import dict_row

from consumer.kinds._audit import Audit
from consumer.kinds._plugin import Conn, Findings, Rows, ranges
from consumer.kinds._resources import Resources
from consumer.kinds.steps import gaps
from consumer.kinds.steps.gaps import UNRESOLVED
from consumer.kinds.steps.parking import lot_of
from consumer.kinds.steps.route import StepRoute
from consumer.kinds.steps.store import StepStore
from schemas.snapshot import snapshot_type

if TYPE_CHECKING:
    from consumer.settings import SweeperSettings


class StepInspector:
    """What a step route shows an operator."""

    def generation(self, conn: Conn, route: StepRoute, entity_id: str) -> int | None:
        """The entity's current generation (None: nothing applied yet)."""
        return StepStore(route).generation(conn, entity_id)

    def story(
        self, tools: Resources[SweeperSettings], route: StepRoute, entity_id: str
    ) -> Findings:
        """Progress, log, skips, failed and unfinished calls, gaps, and what is parked."""
        key = (route.stream, entity_id)
        with tools.conn.cursor(row_factory=dict_row) as cur:
            applied = cur.execute(
                "SELECT generation, last_applied, held_at, stopped_at_seq, stop_reason, "
                "retry_at, updated_at FROM inorder_step_progress "
                "WHERE route = %s AND entity_id = %s",
                key,
            ).fetchone()
            logged = cur.execute(
                "SELECT generation, seq FROM inorder_step_log WHERE route = %s "
                "AND entity_id = %s ORDER BY generation, seq",
                key,
            ).fetchall()
            skips = cur.execute(
                "SELECT generation, from_seq, to_seq, skipped_by, reason, skipped_at "
                "FROM inorder_step_skips WHERE route = %s AND entity_id = %s ORDER BY skipped_at",
                key,
            ).fetchall()
            uncertain = cur.execute(
                "SELECT generation, seq, event_id, started_at FROM inorder_step_attempts "
                "WHERE route = %s AND entity_id = %s AND completed_at IS NULL "
                "ORDER BY started_at",
                key,
            ).fetchall()
            failed = cur.execute(
                "SELECT generation, seq, attempt, error, led_to, retry_at, failed_at "
                "FROM inorder_step_failures WHERE route = %s AND entity_id = %s ORDER BY id",
                key,
            ).fetchall()
        step_log: Rows = [
            _logged(generation, list(rows), failed)
            for generation, rows in groupby(logged, key=lambda r: r["generation"])
        ]
        parked: list[int] = []
        if tools.settings.redis_url is not None:
            parked = lot_of(tools).parked_seqs(route.stream, entity_id)
        sections: dict[str, tuple[str, Rows]] = {
            "step_log": ("step log", step_log),
            "skips": ("skipped (by a person, or by the route after failed calls)", skips),
            "failed_calls": ("failed calls and what each led to", failed),
            "uncertain_calls": ("external calls not known to have finished", uncertain),
            "gaps": ("gaps", _gaps(tools.conn, route.stream, entity_id)),
        }
        return Findings(applied=applied, sections=sections, parked=parked)

    def audit(self, audit: Audit, route: StepRoute) -> None:
        """Every outbox seq of each entity against the step log."""
        snapshot = snapshot_type(route.stream)
        # Snapshots count only where the route takes them as a baseline.
        sent = audit.stream(
            audit.outbox,
            sql.SQL(
                "SELECT entity_id, generation, seq, unsent, failure_reason "
                "FROM {} WHERE entity_type = %s AND (%s::text IS NULL OR entity_id = %s) "
                "AND (%s OR event_type <> %s) "
                'ORDER BY entity_id COLLATE "C", generation, seq'
            ).format(audit.source),
            (route.stream, audit.only, audit.only, route.baseline, snapshot),
        )
        applied = audit.stream(
            audit.consumer,
            sql.SQL(
                "SELECT l.entity_id, l.generation, l.seq, p.generation, p.last_applied, "
                "l.event_type = %s "
                "FROM inorder_step_log l JOIN inorder_step_progress p "
                "ON p.route = l.route AND p.entity_id = l.entity_id WHERE l.route = %s "
                "AND (%s::text IS NULL OR l.entity_id = %s) "
                'ORDER BY l.entity_id COLLATE "C", l.generation, l.seq'
            ),
            (snapshot, route.stream, audit.only, audit.only),
        )
        for entity, events, logged in audit.entity_pairs(sent, applied):
            done = {(row[1], row[2]) for row in logged}
            baselines = [(row[1], row[2]) for row in logged if row[5]]
            missing = [e for e in events if (e[1], e[2]) not in done]
            if baselines:
                audit.healed(route.stream, entity)
                missing = [e for e in missing if not any(e[1:3] < b for b in baselines)]
            if missing:
                _explain_missing(audit, route.stream, entity, missing)
            if logged:
                _, log_gen, log_seq, gen, last, _ = logged[-1]
                if (gen, last) < (log_gen, log_seq):
                    detail = f"progress {gen}/{last} is behind the log's {log_gen}/{log_seq}"
                    audit.diverge(route.stream, entity, detail, None)


def _logged(generation: int, rows: Rows, failed: Rows) -> dict[str, Any]:
    """One generation of the step log: the seqs applied, and those applied after retries."""
    applied = {r["seq"] for r in rows}
    calls: dict[int, int] = {}
    for f in failed:
        if f["generation"] == generation and f["seq"] in applied:
            calls[f["seq"]] = max(calls.get(f["seq"], 0), f["attempt"] + 1)
    found: dict[str, Any] = {"generation": generation, "applied": ranges(r["seq"] for r in rows)}
    if calls:
        found["retried"] = ", ".join(f"{seq} ({n} calls)" for seq, n in sorted(calls.items()))
    return found


def _gaps(conn: Conn, stream: str, entity_id: str) -> Rows:
    return [
        {
            "id": g.id,
            "status": g.status,
            "range": f"{g.generation}/{g.from_seq}..{g.to_seq}",
            "first_seen": g.first_seen,
            "requests": g.attempts,
            "resolved_by": g.resolved_by,
            "reason": g.reason,
        }
        for g in gaps.of_entity(conn, stream, entity_id)
    ]


def _explain_missing(audit: Audit, route: str, entity: str, missing: list[tuple[Any, ...]]) -> None:
    state = audit.consumer.execute(
        "SELECT p.generation, p.held_at IS NOT NULL, p.stopped_at_seq, p.stop_reason, "
        "(SELECT status || ' ' || from_seq || '..' || to_seq FROM inorder_gaps g "
        " WHERE g.route = p.route AND g.entity_id = p.entity_id AND g.status = ANY(%s)) "
        "FROM inorder_step_progress p WHERE p.route = %s AND p.entity_id = %s",
        (UNRESOLVED, route, entity),
    ).fetchone()
    skips = audit.consumer.execute(
        "SELECT generation, from_seq, to_seq FROM inorder_step_skips WHERE route = %s "
        "AND entity_id = %s",
        (route, entity),
    ).fetchall()
    for _, generation, seq, unpublished, failure in missing:
        if any(g == generation and a <= seq <= b for g, a, b in skips):
            continue  # a person decided these seqs will never come
        cause = step_cause(state, generation, seq, unpublished, failure)
        cause = cause or audit.dead_letter(route, entity, generation, seq)
        audit.diverge(route, entity, f"seq {generation}/{seq} not applied", cause)


def step_cause(
    state: Any, generation: int, seq: int, unpublished: bool, failure: str | None
) -> str | None:
    """The first known state that accounts for a step not applied, or None."""
    current, held, stopped_at, reason, gap = state or (generation, False, None, None, None)
    causes = [
        # A newer generation's seq 1 arrived first and started the entity over.
        (generation < current, f"generation {generation} superseded by re-creation ({current})"),
        (bool(failure), f"outbox row failed: {failure}"),
        (unpublished, "not published yet"),
        (
            stopped_at is not None and stopped_at <= seq,
            f"stopped for review at {stopped_at}: {reason}",
        ),
        (gap is not None, f"gap {gap}"),
        (bool(held), "entity held"),
    ]
    return next((text for applies, text in causes if applies), None)
