"""The drain's barrier: what one parked event raises refuses that event only.

A drain applies the due parked events of many entities at once: in the consumer after
a poll batch, in the sweeper after a retry or a missed drain, in the admin commands
after a person acted. None of those events is in the poll batch, so the loop's barrier
(``_barrier.apply_guarded``) would blame the wrong ones, and the sweeper and the admin
commands have no barrier of their own. Here, when a window of parked events raises an
error its input caused (``schemas.runtime.causes``), its entities are applied in
halves, down to one entity; that entity's events are then applied one at a time, in
order, and each that fails alone is refused. The successors of a refused event stay
parked behind the gap it leaves, which the sweeper escalates like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from consumer.kinds._barrier import reset
from consumer.kinds._base import Conn
from consumer.kinds.steps.plan import Events, Plan
from schemas import Event
from schemas.runtime.causes import Cause, cause
from schemas.snapshot import is_snapshot

# Each entity's plan, and the entities named for a lane of their own (``apply_steps``).
Applied = tuple[dict[str, Plan], list[str]]


@dataclass(slots=True)
class Drained:
    """What a guarded drain window did: plans, entities for a lane, events refused."""

    plans: dict[str, Plan] = field(default_factory=dict)
    alone: list[str] = field(default_factory=list)
    refused: list[tuple[Event, Exception]] = field(default_factory=list)

    def join(self, other: Drained) -> Drained:
        """Both windows' results (their entities differ)."""
        return Drained(
            {**self.plans, **other.plans}, self.alone + other.alone, self.refused + other.refused
        )


def apply_parked(apply: Callable[[Events], Applied], conn: Conn, events: Events) -> Drained:
    """``apply(events)``, with the events that fail it on their own refused instead."""
    try:
        plans, alone = apply(events)
    except Exception as exc:
        if cause(exc) is not Cause.INPUT:
            raise
        reset(conn)
        entities = list(events)
        if len(entities) == 1:
            return _one_by_one(apply, conn, entities[0], events[entities[0]], exc)
        half = len(entities) // 2
        first = apply_parked(apply, conn, {e: events[e] for e in entities[:half]})
        return first.join(apply_parked(apply, conn, {e: events[e] for e in entities[half:]}))
    return Drained(plans, alone)


def _one_by_one(
    apply: Callable[[Events], Applied],
    conn: Conn,
    entity: str,
    events: Sequence[Event],
    raised: Exception,
) -> Drained:
    """One entity's events applied one at a time in order; each that raises is refused."""
    if len(events) == 1:
        return Drained(refused=[(events[0], raised)])
    done = Drained()
    for event in sorted(events, key=lambda e: (e.version, is_snapshot(e))):
        try:
            plans, alone = apply({entity: [event]})
        except Exception as exc:
            if cause(exc) is not Cause.INPUT:
                raise
            reset(conn)
            done.refused.append((event, exc))
            continue
        if alone:  # its lane drains it again, behind this barrier
            done.alone += alone
            break
        if entity in plans:
            done.plans[entity] = _then(done.plans.get(entity), plans[entity])
    return done


def _then(before: Plan | None, after: Plan) -> Plan:
    """One entity's plan for two windows applied one after the other."""
    if before is None:
        return after
    return Plan(
        apply=before.apply + after.apply,
        park=before.park + after.park,
        stale=before.stale + after.stale,
        start=before.start,
        end=after.end,
        stopped=after.stopped or before.stopped,
        failed=before.failed + after.failed,
    )
