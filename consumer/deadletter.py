"""Dead letters: input the consumer cannot use goes to a topic with the reason, never dropped.

The copy keeps the original key, value and headers, adds why and where from, and
is in Kafka before the original's offset is committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from consumer import metrics
from consumer.errors import DependencyDownError
from schemas import DecodeError, Event, cloudevents, headers, kafka_key
from schemas.limits import safe_text
from schemas.runtime.causes import Cause, kafka_cause

log = structlog.get_logger(__name__)

# Reason codes of the consumer's own (the codec's come from schemas.codec).
UNKNOWN_STREAM = "unknown_stream"
PROJECTION_REJECTED = "projection_rejected"
PARK_CAP_REACHED = "park_cap_reached"
BATCH_REJECTED = "batch_rejected"
STEP_FAILED = "step_failed"


class Unsent:
    """What a dead letter needs of a message, for an event no message of the batch carries.

    An event drained from parking arrived in an earlier poll batch, whose offset is
    committed: its copy is made of the parked bytes, keyed as the relay keys it; where
    it came from is unknown (topic empty, partition and offset -1).
    """

    __slots__ = ("_key", "_value")

    def __init__(self, event: Event, value: bytes) -> None:
        self._key = kafka_key(event.entity_type, event.entity_id)
        self._value = value

    def value(self) -> bytes:
        """The parked bytes."""
        return self._value

    def key(self) -> bytes:
        """The entity's key."""
        return self._key

    def headers(self) -> list[tuple[str, bytes]]:
        """None: parking keeps the value only."""
        return []

    def topic(self) -> str:
        """Not known."""
        return ""

    def partition(self) -> int:
        """Not known."""
        return -1

    def offset(self) -> int:
        """Not known."""
        return -1


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message to dead-letter, and why."""

    message: Message | Unsent
    reason: str
    detail: str


class Refused(Protocol):
    """A route's refusal of an event (``consumer.kinds.Refusal``), as letters read it."""

    @property
    def event(self) -> Event:
        """The event refused."""

    @property
    def reason(self) -> str:
        """The reason code."""

    @property
    def detail(self) -> str:
        """What exactly was wrong."""

    @property
    def copy(self) -> bytes | None:
        """The event's bytes when no message carries it."""


def unsent(refusals: Sequence[Refused]) -> list[DeadLetter]:
    """Letters of the refusals that carry their event's bytes (events drained from parking)."""
    return [
        DeadLetter(Unsent(r.event, r.copy), r.reason, r.detail)
        for r in refusals
        if r.copy is not None
    ]


def deliver(
    conn: psycopg.Connection[Any],
    producer: Producer,
    settings: LetterSettings,
    letters: Sequence[DeadLetter],
) -> None:
    """Send the letters to the dead-letter topic, record them, and log each."""
    send(producer, settings.dead_letter_topic, letters, settings.dead_letter_max_value_bytes)
    record(conn, letters)
    for dead in letters:
        log.warning(
            "event_dead_lettered",
            reason=dead.reason,
            detail=dead.detail[:200],
            topic=dead.message.topic(),
            partition=dead.message.partition(),
            offset=dead.message.offset(),
        )


class LetterSettings(Protocol):
    """The settings letters are sent under (the consumer's and the sweeper's have them)."""

    @property
    def dead_letter_topic(self) -> str:
        """Where letters go."""

    @property
    def dead_letter_max_value_bytes(self) -> int:
        """A longer value is cut to this."""


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
