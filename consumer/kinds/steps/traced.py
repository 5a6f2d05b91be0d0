"""Spans of what step entities wait for: a predecessor in parking (``park``), a gap (``gap``).

While tracing is active, a step event that parks keeps its message's trace context in
its parked value (the loop stamps it; ``schemas.tracing.stamp``), with when it parked
and how far ahead of its entity it came. Once it is drained and applied, a ``park``
span covers the wait, linked to where the event was written; the span at work when it
is drained (the consumer's batch span) is linked to it as well, so the writer's trace
leads to the apply. Events parked without a context (or before tracing was on) make
no span.

A gap's span runs from its detection to its healing, linked to the sweeper's last
republish request (a PRODUCER span whose context goes in the request's headers) and to
the relay's answer (whose context comes back in the result's headers); both contexts are
kept on the gap's row in between.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from consumer.kinds.steps.gaps import Gap
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


def _gap_attributes(gap: Gap) -> dict[str, Any]:
    return {
        "inorder.route": gap.route,
        "inorder.entity": f"{gap.route}:{gap.entity_id}",
        "inorder.generation": gap.generation,
        "inorder.gap.from_seq": gap.from_seq,
        "inorder.gap.to_seq": gap.to_seq,
    }


@contextmanager
def requesting(gap: Gap, topic: str, attempt: int) -> Iterator[Any]:
    """The span of one republish request for ``gap``, current while it is sent."""
    about = {
        **_gap_attributes(gap),
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.destination.name": topic,
        "inorder.gap.attempt": attempt,
    }
    with tracing.span(f"republish {topic}", "producer", about) as span:
        yield span


def healed(gap: Gap) -> None:
    """The gap's span, from detection until now, linked to its request and the answer."""
    if not tracing.active():
        return
    contexts = [tracing.context_of(gap.request_trace), tracing.context_of(gap.answer_trace)]
    about = {**_gap_attributes(gap), "inorder.gap.attempts": gap.attempts}
    links = tracing.links_to([c for c in contexts if c is not None], {})
    tracing.span_between("gap", gap.first_seen.timestamp(), about, links)
