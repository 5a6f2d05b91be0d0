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
from schemas import Event, headers, kafka_key
from schemas.limits import safe_text
from schemas.runtime.causes import Cause, kafka_cause

log = structlog.get_logger(__name__)

# Reason codes of the consumer's own (the codec's come from schemas.codec).
UNKNOWN_STREAM = "unknown_stream"
# A message that raised while it was read (the codec names every problem it knows).
UNDECODABLE = "undecodable"
# A share group's record on its last delivery that could not be applied before its
# acquisition lock ran out (a dependency down, a lane too slow): lettered, not archived.
DELIVERY_LIMIT = "delivery_limit"


class Unsent:
    """What a dead letter needs of a message, for an event no message of the batch carries.

    An event drained from parking (or a batch result kept for a manifest that never
    came) arrived in an earlier poll batch, whose offset is committed: its copy is made
    of the kept bytes, keyed as the relay keys it; where it came from is unknown (topic
    empty, partition and offset -1).
    """

    __slots__ = ("_key", "_value")

    def __init__(self, key: bytes, value: bytes) -> None:
        self._key = key
        self._value = value

    @classmethod
    def of(cls, event: Event, value: bytes) -> Unsent:
        """The kept bytes of ``event``, keyed as the relay keys it."""
        return cls(kafka_key(event.entity_type, event.entity_id), value)

    def value(self) -> bytes:
        """The kept bytes."""
        return self._value

    def key(self) -> bytes:
        """The entity's key."""
        return self._key

    def headers(self) -> list[tuple[str, bytes]]:
        """None: what keeps the bytes keeps the value only."""
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
    # The event the message carries, when it was read as one (None: it could not be).
    event: Event | None = None


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
        DeadLetter(Unsent.of(r.event, r.copy), r.reason, r.detail, r.event)
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
    placed = send(
        producer, settings.dead_letter_topic, letters, settings.dead_letter_max_value_bytes
    )
    record(conn, letters, placed)
    logged(letters)


def logged(letters: Sequence[DeadLetter]) -> None:
    """One line per letter sent: why, and where its message was."""
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
    out = [(k, v) for k, v in out if not headers.about_a_letter(k)]  # a letter's letter
    out += _where_from(message, dead.reason, dead.detail[:1000])
    if value is not None and len(value) > max_value_bytes:
        out.append((headers.DLQ_TRUNCATED_FROM, str(len(value))))
        value = value[:max_value_bytes]
    return key, value, out


def _where_from(
    message: Message | Unsent, reason: str, detail: str
) -> list[tuple[str, str | bytes | None]]:
    """Why, and the original's place, under inorder's names and those Kafka tooling reads."""
    topic, partition, offset = message.topic() or "", message.partition(), message.offset()
    found: list[tuple[str, str | bytes | None]] = [
        (headers.DLQ_REASON, reason),
        (headers.DLQ_DETAIL, detail),
        (headers.DLQ_TOPIC, topic),
        (headers.DLQ_PARTITION, str(partition)),
        (headers.DLQ_OFFSET, str(offset)),
        (headers.CONNECT_EXCEPTION, reason),
        (headers.CONNECT_MESSAGE, detail),
        (headers.SPRING_EXCEPTION, reason),
        (headers.SPRING_MESSAGE, detail),
    ]
    if topic and partition is not None and partition >= 0 and offset is not None:
        found += [
            (headers.CONNECT_TOPIC, topic),
            (headers.CONNECT_PARTITION, str(partition)),
            (headers.CONNECT_OFFSET, str(offset)),
            (headers.SPRING_TOPIC, topic),
            (headers.SPRING_PARTITION, partition.to_bytes(4, "big", signed=True)),
            (headers.SPRING_OFFSET, offset.to_bytes(8, "big", signed=True)),
        ]
    return found


def replays_of(message: Message | Unsent) -> int:
    """How many times the message's event was replayed from dead letters (its header)."""
    pairs: Any = message.headers() or []
    for key, value in pairs.items() if isinstance(pairs, dict) else pairs:
        if key == headers.REPLAYS and value is not None:
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            return int(text) if text.isdigit() and len(text) < 6 else 0
    return 0


def record(
    conn: psycopg.Connection[Any],
    letters: Sequence[DeadLetter],
    placed: Sequence[Placed | None] = (),
) -> None:
    """Keep a row per dead-lettered event, for the audit to explain and a person to replay.

    ``placed``: where each letter's copy is in the dead-letter topic, as ``send`` returns
    it. A message that is not an event has nothing to explain or replay: it stays in the
    topic only. The replay count is the original's header, or one more than the replays
    of the event's earlier letters (a replay from the outbox carries no header).
    """
    rows = []
    for i, dead in enumerate(letters):
        event = dead.event
        if event is None:
            continue
        m = dead.message
        where = placed[i] if i < len(placed) else None
        rows.append(
            {  # escaped: a letter may be here for holding text no column can store
                "t": safe_text(event.entity_type),
                "e": safe_text(event.entity_id),
                "g": event.generation,
                "s": event.seq,
                "i": safe_text(event.event_id),
                "y": safe_text(event.event_type),
                "r": dead.reason,
                "d": safe_text(dead.detail[:1000]),
                "ot": m.topic() or "",
                "op": m.partition() or 0,
                "oo": m.offset() or 0,
                "lt": None if where is None else where.topic,
                "lp": None if where is None else where.partition,
                "lo": None if where is None else where.offset,
                "cut": where is not None and where.cut,
                "n": replays_of(m),
            }
        )
    if rows:
        with conn.cursor() as cur:
            cur.executemany(_RECORD, rows)


_RECORD = (
    "INSERT INTO inorder_dead_letters (entity_type, entity_id, generation, seq, event_id, "
    "event_type, reason, detail, topic, kafka_partition, kafka_offset, letter_topic, "
    "letter_partition, letter_offset, cut, replays) "
    "SELECT %(t)s, %(e)s, %(g)s, %(s)s, %(i)s, %(y)s, %(r)s, %(d)s, %(ot)s, %(op)s, %(oo)s, "
    "%(lt)s, %(lp)s, %(lo)s, %(cut)s, greatest(%(n)s, (SELECT coalesce(max(replays) + 1, 0) "
    "FROM inorder_dead_letters WHERE event_id = %(i)s AND status = 'replayed'))"
)


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a letter's copy went: topic, partition, offset, and whether it was cut."""

    topic: str
    partition: int
    offset: int
    cut: bool


def send(
    producer: Producer, topic: str, letters: Sequence[DeadLetter], max_value_bytes: int
) -> list[Placed | None]:
    """Produce every dead letter and wait for Kafka to have them all; where each went.

    A copy Kafka refuses for its size (or anything else about that one message) is
    sent again in its minimal form; only an outage fails the batch, to be retried.
    """
    if not letters:
        return []
    placed: list[Placed | None] = [None] * len(letters)
    refused = _produce_all(producer, topic, letters, max_value_bytes, placed, minimal=False)
    if refused:
        again = [letters[i] for i in refused]
        placed_again: list[Placed | None] = [None] * len(again)
        still = _produce_all(producer, topic, again, max_value_bytes, placed_again, minimal=True)
        if still:
            first = next(iter(still.values()))
            raise DependencyDownError(f"dead letters not delivered even cut down: {first}")
        for i, where in zip(refused, placed_again, strict=True):
            placed[i] = where
    for dead in letters:
        metrics.DEAD_LETTERED.labels(dead.reason).inc()
    return placed


def _produce_all(
    producer: Producer,
    topic: str,
    letters: Sequence[DeadLetter],
    max_value_bytes: int,
    placed: list[Placed | None],
    *,
    minimal: bool,
) -> dict[int, str]:
    """Produce and flush, filling ``placed``; the letters Kafka refused for their own sake.

    An outage (a delivery that failed or timed out for any other cause) raises.
    """
    errors: dict[int, KafkaError] = {}
    refused: dict[int, str] = {}
    for i, dead in enumerate(letters):
        key, value, hdrs = letter(dead, max_value_bytes, minimal=minimal)
        cut = minimal or any(k == headers.DLQ_TRUNCATED_FROM for k, _ in hdrs)

        def on_delivery(err: KafkaError | None, msg: Message, i: int = i, cut: bool = cut) -> None:
            if err is not None:
                errors[i] = err
            else:
                placed[i] = Placed(topic, msg.partition() or 0, msg.offset() or 0, cut)

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


def record_held(
    conn: psycopg.Connection[Any], letters: Sequence[DeadLetter], placed: Sequence[Placed | None]
) -> None:
    """Record where each held event's copy went (``placed`` as ``send`` says)."""
    rows = []
    for dead, where in zip(letters, placed, strict=True):
        if where is None:
            continue
        event = dead.event
        if event is None:  # pragma: no cover - only events are held
            continue
        rows.append(
            (
                safe_text(event.entity_type),
                safe_text(event.entity_id),
                event.generation,
                event.seq,
                safe_text(event.event_id),
                where.topic,
                where.partition,
                where.offset,
            )
        )
    if rows:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO inorder_held_events (route, entity_id, generation, seq, event_id, "
                "held_topic, held_partition, held_offset) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                rows,
            )


class PostSettings(LetterSettings, Protocol):
    """The settings letters and held copies are sent under."""

    @property
    def held_topic(self) -> str:
        """Where held copies go."""


def post(
    conn: psycopg.Connection[Any],
    producer: Producer,
    settings: PostSettings,
    refused: Sequence[DeadLetter],
    held: Sequence[DeadLetter],
) -> None:
    """Held copies to the held topic, each recorded where it went; then the letters."""
    placed = send(producer, settings.held_topic, held, settings.dead_letter_max_value_bytes)
    record_held(conn, held, placed)
    deliver(conn, producer, settings, refused)
