"""Dead letters: input the consumer cannot use goes to a topic with the reason, never dropped.

The copy keeps the original key, value and headers, adds why and where from, and
is in Kafka before the original's offset is committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import Message, Producer

from consumer import metrics
from consumer.errors import DependencyDownError
from schemas import DecodeError, decode, headers
from schemas.limits import safe_text

# Reason codes of the consumer's own (the codec's come from schemas.codec).
UNKNOWN_STREAM = "unknown_stream"
PROJECTION_REJECTED = "projection_rejected"
PARK_CAP_REACHED = "park_cap_reached"
BATCH_REJECTED = "batch_rejected"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message to dead-letter, and why."""

    message: Message
    reason: str
    detail: str


def letter(
    dead: DeadLetter, max_value_bytes: int
) -> tuple[bytes | None, bytes | None, list[tuple[str, str | bytes | None]]]:
    """Key, value and headers of the dead-letter copy (pure).

    A value over ``max_value_bytes`` is cut to that size and the original length
    is kept in a header; the original stays at the topic, partition and offset named.
    """
    message = dead.message
    value = message.value()
    original = message.headers() or []
    pairs = original.items() if isinstance(original, dict) else original
    out: list[tuple[str, str | bytes | None]] = list(pairs)
    out += [
        (headers.DLQ_REASON, dead.reason),
        (headers.DLQ_DETAIL, dead.detail[:1000]),
        (headers.DLQ_TOPIC, message.topic() or ""),
        (headers.DLQ_PARTITION, str(message.partition())),
        (headers.DLQ_OFFSET, str(message.offset())),
    ]
    if value is not None and len(value) > max_value_bytes:
        out.append((headers.DLQ_TRUNCATED_FROM, str(len(value))))
        value = value[:max_value_bytes]
    return message.key(), value, out


def record(conn: psycopg.Connection[Any], letters: Sequence[DeadLetter]) -> None:
    """Keep a row per dead-lettered event whose entity is known, for the audit to explain it."""
    rows = []
    for dead in letters:
        try:
            event = decode(dead.message.value())
        except DecodeError:
            continue  # not an event: nothing in the projections or step logs to explain
        m = dead.message
        rows.append(
            (  # escaped: a letter may be here for holding text no column can store
                safe_text(event.entity_type),
                safe_text(event.entity_id),
                event.generation,
                event.seq,
                safe_text(event.event_id),
                dead.reason,
                safe_text(dead.detail[:1000]),
                m.topic() or "",
                m.partition() or 0,
                m.offset() or 0,
            )
        )
    if rows:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO inorder_dead_letters (entity_type, entity_id, generation, seq, "
                "event_id, reason, detail, topic, kafka_partition, kafka_offset) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                rows,
            )


def send(
    producer: Producer, topic: str, letters: Sequence[DeadLetter], max_value_bytes: int
) -> None:
    """Produce every dead letter and wait for Kafka to have them all."""
    if not letters:
        return
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for dead in letters:
        key, value, hdrs = letter(dead, max_value_bytes)
        producer.produce(topic, value, key, headers=hdrs, on_delivery=on_delivery)
    remaining = producer.flush(30)
    if failures or remaining:
        raise DependencyDownError(f"dead letters not delivered: {failures[:1] or 'timed out'}")
    for dead in letters:
        metrics.DEAD_LETTERED.labels(dead.reason).inc()
