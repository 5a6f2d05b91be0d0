"""Spans of a step event's wait in parking: how long it waited for its predecessor.

While tracing is active, a step event that parks keeps its message's trace context in
its parked value (the loop stamps it; ``schemas.tracing.stamp``), with when it parked
and how far ahead of its entity it came. Once it is drained and applied, a ``park``
span covers the wait, linked to where the event was written; the span at work when it
is drained (the consumer's batch span) is linked to it as well, so the writer's trace
leads to the apply. Events parked without a context (or before tracing was on) make
no span.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from consumer.kinds.steps.plan import Plan, reorder_distance
from schemas import Event, tracing


def parked_values(
    early: Sequence[tuple[Plan, Event]], values: Sequence[bytes]
) -> list[tuple[Plan, Event, int, bytes]]:
    """Each early event with its reorder distance and the value to park (distance stamped)."""
    made = []
    for (entity_plan, event), value in zip(early, values, strict=True):
        assert entity_plan.end is not None
        distance = reorder_distance(entity_plan.end, event)
        kept = tracing.with_distance(value, distance) if tracing.INSTALLED else value
        made.append((entity_plan, event, distance, kept))
    return made


def drained(route: str, applied: Iterable[tuple[Event, bytes]]) -> None:
    """A ``park`` span for each applied event that waited with a trace context."""
    if not tracing.active():
        return
    for event, value in applied:
        found = tracing.waited(value)
        if found is None:
            continue
        context, began, distance = found
        entity = f"{event.entity_type}:{event.entity_id}"
        attributes = {"inorder.entity": entity, "inorder.seq": event.seq}
        tracing.link_current(context, attributes)
        about = {**attributes, "inorder.route": route}
        if distance is not None:
            about["inorder.reorder_distance"] = distance
        tracing.span_between("park", began, about, tracing.links_to([context], attributes))
