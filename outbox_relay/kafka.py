"""Thin wrappers over confluent-kafka: the idempotent producer, delivery reports, requests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from outbox_relay.rows import MESSAGE_ROW_ID, MESSAGE_VALUE
from outbox_relay.rows import Message as OutMessage
from outbox_relay.settings import RelaySettings
from outbox_relay.topics import TopicCheck
from schemas.runtime import kafka_clients
from schemas.runtime.causes import Cause, kafka_cause
from schemas.runtime.health import Health

log = structlog.get_logger(__name__)

Failure = tuple[KafkaError, Message]

# produce()'s partition meaning "the partitioner decides" (RD_KAFKA_PARTITION_UA).
ANY_PARTITION = -1


def make_producer(
    settings: RelaySettings,
    health: Health,
    on_failure: Callable[[Failure], None],
) -> Producer:
    """The idempotent, acks=all producer every relay send goes through.

    Only failed deliveries are reported, each to ``on_failure``; a message's own
    ``on_delivery`` callback is likewise called only when it fails.
    """

    def on_error(err: KafkaError) -> None:  # logged by kafka_clients' own callback
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            health.blocked("kafka", "all brokers down")

    return kafka_clients.producer(
        settings,
        "inorder-relay",
        fixed={
            # The next batch is read while this one is in flight, so a lingering batch
            # would wait for that read: send at once. Messages queued while a request is
            # out still go together, so large batches stay large.
            "linger.ms": 0,
            "compression.type": "lz4",
            # Same partition for a key as Java clients choose, so mixed producers agree.
            "partitioner": "murmur2_random",
            "message.timeout.ms": settings.delivery_timeout_ms,
            "message.max.bytes": settings.max_message_bytes + 65_536,
            "error_cb": on_error,
            "delivery.report.only.error": True,
            "on_delivery": lambda err, msg: on_failure((err, msg)),
        },
    )


def make_request_consumer(settings: RelaySettings) -> Consumer:
    """Reader of the republish-request topic; offsets committed only after an answer."""
    consumer = kafka_clients.consumer(
        settings,
        "inorder-relay",
        settings.relay_group_id,
        assignor="cooperative-sticky",
    )
    consumer.subscribe([settings.republish_requests_topic])
    return consumer


@dataclass(slots=True)
class Sent:
    """Rows Kafka did not take: refused for good, or failed for now (to be sent again)."""

    rejected: list[tuple[int, str]] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)

    def add(self, row_id: int, err: KafkaError) -> None:
        """Count one row Kafka did not take: refused for good, or failed for now."""
        # What one row caused (too large, a topic refused) fails that row, however often sent.
        bucket = self.rejected if kafka_cause(err.code()) is Cause.INPUT else self.failed
        bucket.append((row_id, err.name()))

    def missing(self) -> set[int]:
        """Every row id not delivered."""
        return {row_id for row_id, _ in self.rejected} | {row_id for row_id, _ in self.failed}


class Sender:
    """Sends groups of messages and learns which failed, with no Python call per delivery.

    The producer reports errors only (``delivery.report.only.error``) to one callback;
    a failed message is matched back to its row by its value (every value differs:
    it holds the event id), and only when something failed.
    """

    def __init__(self, settings: RelaySettings, health: Health) -> None:
        self._errors: list[Failure] = []
        self.producer = make_producer(settings, health, self._errors.append)
        self.topics = TopicCheck(
            self.producer,
            settings.allowed_topics,
            settings.unknown_topic_grace_s,
            reserved=(settings.republish_requests_topic, settings.republish_results_topic),
        )
        self._in_flight: list[OutMessage] = []
        self._sent = Sent()

    def produce(self, messages: Sequence[OutMessage]) -> None:
        """Hand ``messages`` to the producer; ``wait`` reports on them."""
        produce, in_flight = self.producer.produce, self._in_flight
        for message in messages:
            row_id, topic, key, value, headers = message
            try:
                # All positional: keyword arguments cost the C call a lookup per name not
                # given (about a microsecond a message, measured).
                produce(topic, value, key, ANY_PARTITION, None, None, 0, headers)
            except KafkaException as exc:
                self._sent.add(row_id, exc.args[0])
            except BufferError:
                self.producer.poll(0.1)
                self._sent.failed.append((row_id, "local_queue_full"))
            else:
                in_flight.append(message)

    def wait(self, wait_s: float) -> Sent:
        """Wait until Kafka answered for everything produced (or ``wait_s``); what it refused."""
        left = self.producer.flush(wait_s)
        sent, in_flight, errors = self._sent, self._in_flight, self._errors[:]
        self._sent, self._in_flight = Sent(), []
        self._errors.clear()
        if errors or left:
            rows = {m[MESSAGE_VALUE]: m[MESSAGE_ROW_ID] for m in in_flight}
            for err, msg in errors:
                row_id = rows.pop(msg.value() or b"", None)
                if row_id is not None:
                    sent.add(row_id, err)
            if left:  # still queued after the wait: not delivered as far as anyone knows
                sent.failed.extend((row_id, "timed_out") for row_id in rows.values())
        return sent

    def send(self, messages: Sequence[OutMessage], wait_s: float) -> Sent:
        """Produce ``messages`` and wait for Kafka's answer."""
        self.produce(messages)
        return self.wait(wait_s)
