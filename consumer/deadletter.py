"""Dead letters: input the consumer cannot use goes to a topic with the reason, never dropped.

The copy keeps the original key, value and headers, adds why and where from, and
is in Kafka before the original's offset is committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from consumer import metrics
from consumer.errors import DependencyDownError
from schemas import DecodeError, cloudevents, headers
from schemas.limits import safe_text
from schemas.runtime.causes import Cause, kafka_cause

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


Letter = tuple[bytes | None, bytes | None, list[tuple[str, str | bytes | None]]]

# A copy Kafka refused as too large is sent again cut to this, without the original's
# headers: the reason and the original's place always reach the topic.
MINIMAL_BYTES = 16 * 1024


def letter(dead: DeadLetter, max_value_bytes: int, *, minimal: bool = False) -> Letter:
    """Key, value and headers of the dead-letter copy (pure).

    A value over ``max_value_bytes`` is cut to that size and the original length
    is kept in a header; the original stays at the topic, partition and offset named.
    ``minimal`` cuts key and value to ``MINIMAL_BYTES`` and leaves the original's
    headers out, for a copy Kafka refused whole.
    """
    message = dead.message
    value, key = message.value(), message.key()
    original = message.headers() or []
    pairs = original.items() if isinstance(original, dict) else original
    out: list[tuple[str, str | bytes | None]] = [] if minimal else list(pairs)
    if minimal:
        max_value_bytes = min(max_value_bytes, MINIMAL_BYTES)
        if key is not None and len(key) > MINIMAL_BYTES:
            key = key[:MINIMAL_BYTES]
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
    return key, value, out


def record(conn: psycopg.Connection[Any], letters: Sequence[DeadLetter]) -> None:
    """Keep a row per dead-lettered event whose entity is known, for the audit to explain it."""
    rows = []
    for dead in letters:
        try:
            event, _ = cloudevents.decode_message(dead.message.value(), dead.message.headers())
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
    """Produce every dead letter and wait for Kafka to have them all.

    A copy Kafka refuses for its size (or anything else about that one message) is
    sent again in its minimal form; only an outage fails the batch, to be retried.
    """
    if not letters:
        return
    refused = _produce_all(producer, topic, letters, max_value_bytes, minimal=False)
    if refused:
        again = [letters[i] for i in refused]
        still = _produce_all(producer, topic, again, max_value_bytes, minimal=True)
        if still:
            first = next(iter(still.values()))
            raise DependencyDownError(f"dead letters not delivered even cut down: {first}")
    for dead in letters:
        metrics.DEAD_LETTERED.labels(dead.reason).inc()


def _produce_all(
    producer: Producer,
    topic: str,
    letters: Sequence[DeadLetter],
    max_value_bytes: int,
    *,
    minimal: bool,
) -> dict[int, str]:
    """Produce and flush; the letters Kafka refused for their own sake (index -> why).

    An outage (a delivery that failed or timed out for any other cause) raises.
    """
    errors: dict[int, KafkaError] = {}
    refused: dict[int, str] = {}
    for i, dead in enumerate(letters):
        key, value, hdrs = letter(dead, max_value_bytes, minimal=minimal)

        def on_delivery(err: KafkaError | None, _msg: object, i: int = i) -> None:
            if err is not None:
                errors[i] = err

        try:
            producer.produce(topic, value, key, headers=hdrs, on_delivery=on_delivery)
        except KafkaException as exc:  # refused before sending: the message is too large
            if kafka_cause(exc.args[0].code()) is not Cause.INPUT:
                raise
            refused[i] = str(exc.args[0])
    remaining = producer.flush(30)
    for i, err in errors.items():
        if kafka_cause(err.code()) is not Cause.INPUT:
            raise DependencyDownError(f"dead letters not delivered: {err}")
        refused[i] = str(err)
    if remaining:
        raise DependencyDownError("dead letters not delivered: timed out")
    return refused
