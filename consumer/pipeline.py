"""One poll batch: decode, route, apply. Decisions are pure; ``apply`` is the PostgreSQL step."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Message, TopicPartition

from consumer import deadletter, metrics
from consumer.deadletter import DeadLetter
from consumer.projection import Conn, ProjectionTable
from consumer.projection import apply as apply_projection
from consumer.router import Router
from schemas import DecodeError, Event, decode


@dataclass(frozen=True, slots=True)
class Prepared:
    """A poll batch decoded and routed: events by stream, and what must be dead-lettered."""

    messages: Sequence[Message]
    by_stream: Mapping[str, list[Event]]
    dead: list[DeadLetter]
    timestamps: Mapping[str, float]
    raw: Mapping[str, bytes]


def prepare(messages: Sequence[Message], router: Router, max_bytes: int) -> Prepared:
    """Decode every message; undecodable ones and those of unrouted streams become dead letters."""
    events: list[Event | None] = []
    dead: list[DeadLetter] = []
    stamps: dict[str, float] = {}
    raw: dict[str, bytes] = {}
    for message in messages:
        try:
            event = decode(message.value(), max_bytes=max_bytes)
        except DecodeError as exc:
            dead.append(DeadLetter(message, exc.reason, exc.detail))
            events.append(None)
        else:
            events.append(event)
            stamps[event.event_id] = message.timestamp()[1] / 1000
            raw[event.event_id] = message.value() or b""
    routed = router.split(events)
    for index in routed.unrouted:
        stream = events[index].entity_type  # type: ignore[union-attr]
        dead.append(
            DeadLetter(
                messages[index], deadletter.UNKNOWN_STREAM, f"no route for stream {stream!r}"
            )
        )
    return Prepared(messages, routed.by_stream, dead, stamps, raw)


def apply_projections(
    conn: Conn, tables: Mapping[str, ProjectionTable], prepared: Prepared
) -> list[DeadLetter]:
    """Apply every projection route's events in one transaction; return events refused.

    Metrics are counted only after the transaction committed.
    """
    by_event: dict[str, Message] = {}
    outcomes = []
    with conn.transaction():
        for stream, events in prepared.by_stream.items():
            if stream in tables:
                outcomes.append((stream, apply_projection(conn, tables[stream], events)))
    now = time.time()
    refused: list[DeadLetter] = []
    for stream, outcome in outcomes:
        metrics.APPLIED.labels(stream).inc(len(outcome.applied))
        for event_type, count in Counter(e.event_type for e in outcome.stale).items():
            metrics.STALE.labels(event_type).inc(count)
        for event in outcome.applied:
            metrics.APPLY_LATENCY.observe(max(0.0, now - prepared.timestamps[event.event_id]))
        if outcome.rejected and not by_event:
            by_event = _message_by_event(prepared)
        refused += [
            DeadLetter(by_event[e.event_id], deadletter.PROJECTION_REJECTED, reason)
            for e, reason in outcome.rejected
        ]
    return refused


def held_letters(prepared: Prepared, held: Sequence[Event]) -> list[DeadLetter]:
    """Dead-letter copies (for the held topic) of events a full parking set refused."""
    if not held:
        return []
    by_event = _message_by_event(prepared)
    return [
        DeadLetter(by_event[e.event_id], deadletter.PARK_CAP_REACHED, f"entity {e.entity_id} "
                   f"has reached its parking cap at seq {e.seq}")
        for e in held
    ]  # fmt: skip


def _message_by_event(prepared: Prepared) -> dict[str, Message]:
    out = {}
    for message in prepared.messages:
        try:
            out[decode(message.value()).event_id] = message
        except DecodeError:
            continue
    return out


def next_offsets(messages: Sequence[Message]) -> list[TopicPartition]:
    """The offsets to commit once every message of the batch is done: last + 1 per partition."""
    last: dict[tuple[str, int], int] = {}
    for message in messages:
        key = (message.topic() or "", message.partition() or 0)
        last[key] = max(last.get(key, -1), message.offset() or 0)
    return [TopicPartition(t, p, o + 1) for (t, p), o in sorted(last.items())]
