"""A step that raised: its failure counted, decided (``retries.decide``) and written at once.

One transaction reads how many calls of this step failed before, writes the failure
with what it leads to, and leaves the entity in its new state: waiting for its retry
(a stop with ``retry_at``, which the sweeper lifts when due), stopped for a person, or
moved on past the step: skipped (recorded as the route's skip) or dead-lettered (the
caller sends the letter, which the audit finds). Also the statements
the sweeper's tick uses to find and resume entities whose retry is due.
"""

from __future__ import annotations

import random

import structlog

from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.retries import Action, Failed, decide
from consumer.kinds.steps.store import Conn, StepStore
from schemas import Event
from schemas.limits import safe_text

log = structlog.get_logger(__name__)
# Who a skip after spent retries is recorded as (``inorder_step_skips.skipped_by``).
RETRIES = "retries"


def failed(
    conn: Conn, store: StepStore, handlers: Handlers, event: Event, error: BaseException
) -> Failed:
    """Count, decide and write one failed call of ``event``'s step; what it led to."""
    entry = handlers.entry(event)
    retry = None if entry is None else entry[0].retry
    text = safe_text(repr(error)[:1000])
    with conn.transaction():
        failures = _count(conn, store, event)
        verdict = decide(retry, failures, error, random.random())  # noqa: S311 - jitter
        outcome = Failed(event, verdict, text, failures)
        _write(conn, store, outcome)
    log.error(
        "step_failed",
        route=store.route.stream,
        entity=event.entity_id,
        seq=event.seq,
        attempt=failures,
        action=verdict.action,
        retry_in_s=round(verdict.delay_s, 3) if verdict.action is Action.RETRY else None,
        error=text[:200],
    )
    return outcome


def _count(conn: Conn, store: StepStore, event: Event) -> int:
    """How many calls of this step have failed, this one included."""
    row = conn.execute(
        "UPDATE inorder_step_progress SET failures = CASE WHEN "
        "(failed_generation, failed_seq) = (%(g)s, %(s)s) THEN failures + 1 ELSE 1 END, "
        "failed_generation = %(g)s, failed_seq = %(s)s "
        "WHERE route = %(r)s AND entity_id = %(e)s RETURNING failures",
        {"r": store.route.stream, "e": event.entity_id, "g": event.generation, "s": event.seq},
    ).fetchone()
    return 1 if row is None else int(row[0])


def _write(conn: Conn, store: StepStore, outcome: Failed) -> None:
    """The entity's new state and the failure's record, as the verdict says."""
    event, verdict = outcome.event, outcome.verdict
    params = {"r": store.route.stream, "e": event.entity_id, "g": event.generation}
    params |= {"s": event.seq, "why": outcome.reason, "d": verdict.delay_s}
    if verdict.action is Action.RETRY:
        conn.execute(
            "UPDATE inorder_step_progress SET stopped_at_seq = %(s)s, stop_reason = %(why)s, "
            "stopped_at = now(), retry_at = now() + make_interval(secs => %(d)s), "
            "updated_at = now() WHERE route = %(r)s AND entity_id = %(e)s",
            params,
        )
    elif verdict.action is Action.STOP:
        store.stop(conn, event.entity_id, event.seq, outcome.reason)
    else:  # moved on past the step, never back: the guard keeps a later position
        conn.execute(
            "UPDATE inorder_step_progress SET generation = %(g)s, last_applied = %(s)s, "
            "stopped_at_seq = NULL, stop_reason = NULL, stopped_at = NULL, retry_at = NULL, "
            "updated_at = now() WHERE route = %(r)s AND entity_id = %(e)s "
            "AND (generation, last_applied) < (%(g)s, %(s)s)",
            params,
        )
        if verdict.action is Action.SKIP:  # a dead letter explains itself in the audit
            skipped = (event.generation, event.seq, event.seq)
            store.note_skip(conn, event.entity_id, skipped, RETRIES, outcome.reason)
    conn.execute(
        "INSERT INTO inorder_step_failures (route, entity_id, generation, seq, event_id, "
        "event_type, attempt, error, led_to, retry_at) VALUES (%(r)s, %(e)s, %(g)s, %(s)s, "
        "%(i)s, %(t)s, %(n)s, %(err)s, %(a)s, CASE WHEN %(a)s = 'retry' "
        "THEN now() + make_interval(secs => %(d)s) END)",
        params
        | {
            "i": safe_text(event.event_id),
            "t": safe_text(event.event_type),
            "n": outcome.attempt,
            "err": outcome.error,
            "a": str(verdict.action),
        },
    )


def due(conn: Conn, store: StepStore, limit: int) -> list[str]:
    """Entities of the route whose retry is due, longest due first."""
    rows = conn.execute(
        "SELECT entity_id FROM inorder_step_progress WHERE route = %s AND retry_at <= now() "
        "ORDER BY retry_at LIMIT %s",
        (store.route.stream, limit),
    ).fetchall()
    return [row[0] for row in rows]


def resume(conn: Conn, store: StepStore, entity_id: str) -> bool:
    """Lift a due retry's stop (its failures stay counted); False if no longer due."""
    row = conn.execute(
        "UPDATE inorder_step_progress SET stopped_at_seq = NULL, stop_reason = NULL, "
        "stopped_at = NULL, retry_at = NULL, updated_at = now() "
        "WHERE route = %s AND entity_id = %s AND retry_at <= now() RETURNING 1",
        (store.route.stream, entity_id),
    ).fetchone()
    return row is not None
