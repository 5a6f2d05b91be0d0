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
    # The message each event came in (by event id), and its value, for parking.
    by_event: Mapping[str, Message]
    raw: Mapping[str, bytes]


def prepare(messages: Sequence[Message], router: Router, max_bytes: int) -> Prepared:
    """Decode every message; undecodable ones and those of unrouted streams become dead letters."""
    events: list[Event | None] = []
    dead: list[DeadLetter] = []
    by_event: dict[str, Message] = {}
    raw: dict[str, bytes] = {}
    for message in messages:
        try:
            event = decode(message.value(), max_bytes=max_bytes)
        except DecodeError as exc:
            dead.append(DeadLetter(message, exc.reason, exc.detail))
            events.append(None)
        else:
            events.append(event)
            by_event[event.event_id] = message
            raw[event.event_id] = message.value() or b""
    routed = router.split(events)
    for index in routed.unrouted:
        stream = events[index].entity_type  # type: ignore[union-attr]
        dead.append(
            DeadLetter(
                messages[index], deadletter.UNKNOWN_STREAM, f"no route for stream {stream!r}"
            )
        )
    return Prepared(messages, routed.by_stream, dead, by_event, raw)


def apply_projections(
    conn: Conn, tables: Mapping[str, ProjectionTable], prepared: Prepared
) -> list[DeadLetter]:
    """Apply every projection route's events in one transaction; return events refused.

    Metrics are counted only after the transaction committed.
    """
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
            sent_at = prepared.by_event[event.event_id].timestamp()[1] / 1000
            metrics.APPLY_LATENCY.observe(max(0.0, now - sent_at))
        refused += [
            DeadLetter(prepared.by_event[e.event_id], deadletter.PROJECTION_REJECTED, reason)
            for e, reason in outcome.rejected
        ]
    return refused


def batch_letters(prepared: Prepared, refused: Sequence[tuple[Event, str]]) -> list[DeadLetter]:
    """Dead letters of batch events the batch routes could not use, with the reason."""
    return [
        DeadLetter(prepared.by_event[e.event_id], deadletter.BATCH_REJECTED, reason)
        for e, reason in refused
    ]


def held_letters(prepared: Prepared, held: Sequence[Event]) -> list[DeadLetter]:
    """Dead-letter copies (for the held topic) of events a full parking set refused."""
    return [
        DeadLetter(
            prepared.by_event[e.event_id],
            deadletter.PARK_CAP_REACHED,
            f"entity {e.entity_id} has reached its parking cap at seq {e.seq}",
        )
        for e in held
    ]


def next_offsets(messages: Sequence[Message]) -> list[TopicPartition]:
    """The offsets to commit once every message of the batch is done: last + 1 per partition."""
    last: dict[tuple[str, int], int] = {}
    for message in messages:
        key = (message.topic() or "", message.partition() or 0)
        last[key] = max(last.get(key, -1), message.offset() or 0)
    return [TopicPartition(t, p, o + 1) for (t, p), o in sorted(last.items())]
