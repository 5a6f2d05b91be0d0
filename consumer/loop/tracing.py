"""The consumer's span per route's share of a poll batch: CONSUMER, linked to each event's origin.

Made only while tracing is active (``schemas.tracing``). The span is current while the
route applies, so database instrumentation nests under it; each link is an event's
creation context (the writer's span, through the outbox and Kafka headers) with the
event's id. What the share did ends up on the span as counts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Message

from consumer.kinds import Applier, Outcome
from schemas import Event, tracing


@contextmanager
def processing(
    applier: Applier[Any], events: Sequence[Event], by_event: Mapping[Event, Message], group: str
) -> Iterator[Any]:
    """The share's span, current for the block; None when tracing is not active."""
    if not tracing.active():
        yield None
        return
    messages = [by_event[event] for event in events]
    topics = {message.topic() for message in messages}
    topic = next(iter(topics)) if len(topics) == 1 else None
    attributes: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.batch.message_count": len(events),
        "messaging.consumer.group.name": group,
        "inorder.route": applier.route.stream,
    }
    if topic is not None:
        attributes["messaging.destination.name"] = topic
    # One attribute per link (the event's id names its entity and version): the SDK
    # checks every attribute, and a share links up to MOST_LINKS events.
    links = tracing.links(
        (message.headers(), {"inorder.event_id": event.event_id})
        for event, message in zip(events, messages, strict=True)
    )
    name = f"process {topic or applier.route.stream}"
    with tracing.span(name, "consumer", attributes, links) as span:
        yield span


def counted(span: Any, outcome: Outcome) -> None:
    """Put what the share did on its span (None: not traced)."""
    if span is None:
        return
    span.set_attributes(outcome.attributes())


class Stamped(Mapping[Event, bytes]):
    """The batch's event values, each read with its message's trace context stamped in.

    A route reads a value to keep it (a step event that parks): the context goes with
    it, so the wait and the apply after it can be linked to the writer's trace. Values
    no route asks for cost nothing.
    """

    def __init__(self, raw: Mapping[Event, bytes], by_event: Mapping[Event, Message]) -> None:
        self._raw = raw
        self._by_event = by_event

    def __getitem__(self, event: Event) -> bytes:
        return tracing.stamp(self._raw[event], self._by_event[event].headers())

    def __contains__(self, event: object) -> bool:
        return event in self._raw

    def __iter__(self) -> Iterator[Event]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


def values(raw: Mapping[Event, bytes], by_event: Mapping[Event, Message]) -> Mapping[Event, bytes]:
    """What routes read the batch's values from: stamped while tracing is active."""
    return Stamped(raw, by_event) if tracing.active() else raw
