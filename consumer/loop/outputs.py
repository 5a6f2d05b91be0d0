"""What the consumer writes to Kafka besides settling its source: letters, and the topics.

Dead letters and held copies go through one producer of their own, flushed right after
each batch; the topics the consumer reads and writes are created at start-up when asked.
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import Producer

from consumer.settings import ConsumerSettings
from schemas.runtime import kafka_clients
from schemas.topics import ensure_topics

# Room in a letter's message for its key and headers, beyond the value's cap.
LETTER_ROOM = 262_144


def letters_producer(settings: ConsumerSettings) -> Producer:
    """The producer of dead letters and held copies."""
    return kafka_clients.producer(
        settings,
        "inorder-consumer-dlq",
        fixed={
            "message.max.bytes": settings.dead_letter_max_value_bytes + LETTER_ROOM,
            # A flush sends at once whatever linger.ms says; lingering would only delay
            # the batch being marked done.
            "linger.ms": 0,
        },
    )


def create_topics(settings: ConsumerSettings, route_topics: Sequence[str]) -> None:
    """Create the topics it reads and writes that are missing (``INORDER_CREATE_TOPICS``)."""
    if not settings.create_topics:
        return
    ensure_topics(
        settings.kafka_config(),
        [
            *settings.topics,
            *settings.debezium_topics,
            settings.dead_letter_topic,
            settings.held_topic,
            *route_topics,
        ],
        settings.topic_partitions,
        factor=settings.topic_replication_factor,
        min_insync=settings.topic_min_insync_replicas,
    )
