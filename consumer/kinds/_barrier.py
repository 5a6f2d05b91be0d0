"""The consumer's barrier: what one event raises in a route refuses that event only.

A route applies its share of a poll batch as one unit. When that unit raises, the
error is classified (``schemas.runtime.causes``): an outage goes up to the loop,
which pauses and tries the whole batch again; anything the input caused is found by
bisection, the share applied in halves, down to the events that fail alone. Those
are dead-lettered with the reason, and every other event of the share is applied as
if they had never come. Halves keep the share's order, so each entity's events are
offered in the order they arrived, and a kind's idempotence by ``(generation, seq)``
makes a half applied again after its sibling failed harmless.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import structlog
from psycopg.pq import TransactionStatus

from consumer.kinds._base import Applier, Conn
from consumer.kinds._outcome import Outcome, Refusal, merge
from schemas import Event
from schemas.limits import safe_text
from schemas.runtime.causes import Cause, cause
from schemas.runtime.logs import first_line

log = structlog.get_logger(__name__)

# Reason code of an event a route raised on (the detail names the error).
APPLY_FAILED = "apply_failed"


def apply_guarded(
    applier: Applier[Any], conn: Conn, events: Sequence[Event], raw: Mapping[Event, bytes]
) -> Outcome:
    """``applier.apply``, with the events that fail it on their own refused instead."""
    try:
        return applier.apply(conn, events, raw)
    except Exception as exc:
        if cause(exc) is not Cause.INPUT:
            raise
        reset(conn)
        if len(events) == 1:
            return Outcome(refused=[refusal(applier.route.stream, events[0], exc)])
        half = len(events) // 2
        first = apply_guarded(applier, conn, events[:half], raw)
        return merge(first, apply_guarded(applier, conn, events[half:], raw))


def refusal(route: str, event: Event, exc: Exception, copy: bytes | None = None) -> Refusal:
    """The event refused for what it raised alone, logged; ``copy``: its parked bytes."""
    state = getattr(exc, "sqlstate", None)
    detail = safe_text(f"{type(exc).__name__}{f' {state}' if state else ''}: {first_line(exc)}")
    log.error(
        "event_refused_by_route",
        route=route,
        entity=event.entity_id,
        seq=event.seq,
        error=detail[:300],
    )
    return Refusal(event, APPLY_FAILED, detail[:1000], copy)


def reset(conn: Conn) -> None:
    """Leave no failed transaction behind for the next try (the kinds normally close theirs)."""
    if conn.closed:
        raise psycopg.OperationalError("the connection closed while a route applied a batch")
    if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        conn.rollback()
