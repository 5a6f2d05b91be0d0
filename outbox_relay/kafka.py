"""Thin wrappers over confluent-kafka: the idempotent producer, delivery reports, requests."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from outbox_relay import metrics
from outbox_relay.rows import Message as OutMessage
from outbox_relay.settings import RelaySettings
from schemas.runtime.health import Health

log = structlog.get_logger(__name__)

# Kafka will never accept these for this row, however often it is sent.
PERMANENT = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD})


def make_producer(settings: RelaySettings, health: Health) -> Producer:
    """The idempotent, acks=all producer every relay send goes through."""

    def on_error(err: KafkaError) -> None:
        log.warning("kafka_error", code=err.name(), detail=err.str())
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            health.blocked("kafka", "all brokers down")

    config: dict[str, Any] = {
        **settings.kafka_config(),
        "client.id": "inorder-relay",
        "enable.idempotence": True,
        "acks": "all",
        # Only shapes the produce batches while one send is queued: every send ends in a
        # flush, which sends at once whatever linger.ms says, so this adds no latency.
        "linger.ms": 5,
        "compression.type": "lz4",
        # Same partition for a key as Java clients choose, so mixed producers agree.
        "partitioner": "murmur2_random",
        "message.timeout.ms": settings.delivery_timeout_ms,
        "message.max.bytes": settings.max_message_bytes + 65_536,
        "error_cb": on_error,
    }
    return Producer(config)


def make_request_consumer(settings: RelaySettings) -> Consumer:
    """Reader of the republish-request topic; offsets committed only after an answer."""
    config: dict[str, Any] = {
        **settings.kafka_config(),
        "client.id": "inorder-relay",
        "group.id": settings.relay_group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
    }
    consumer = Consumer(config)
    consumer.subscribe([settings.republish_requests_topic])
    return consumer


@dataclass(slots=True)
class Sent:
    """The outcome of sending a group of messages."""

    delivered: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)


def _report(sent: Sent, row_id: int, created_at: float) -> Callable[[Any, Message], None]:
    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            sent.delivered.append(row_id)
            metrics.PUBLISH_LATENCY.observe(max(0.0, time.time() - created_at))
        elif err.code() in PERMANENT:
            sent.rejected.append((row_id, err.name()))
        else:
            sent.failed.append((row_id, err.name()))

    return on_delivery


def send(
    producer: Producer, messages: Sequence[OutMessage], created_at: dict[int, float], wait_s: float
) -> Sent:
    """Produce ``messages`` and wait for every delivery report (or ``wait_s``)."""
    sent = Sent()
    for message in messages:
        try:
            producer.produce(
                message.topic,
                message.value,
                message.key,
                headers=message.headers,
                on_delivery=_report(sent, message.row_id, created_at[message.row_id]),
            )
        except KafkaException as exc:
            err = exc.args[0]
            bucket = sent.rejected if err.code() in PERMANENT else sent.failed
            bucket.append((message.row_id, err.name()))
        except BufferError:
            producer.poll(0.1)
            sent.failed.append((message.row_id, "local_queue_full"))
    producer.flush(wait_s)
    return sent
