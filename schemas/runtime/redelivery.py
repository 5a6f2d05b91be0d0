"""Reading a protocol topic one message at a time without losing the rest of a fetch.

The relay and the sweeper take a few messages at once and commit each after acting on
it. When acting or committing fails (an outage, a rebalance under way), the messages
not yet done are in hand but past the consumer's position: without a rewind, the next
fetch would start after them and the next commit would pass them, unread.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition


def rewind(consumer: Consumer, undone: Sequence[Message]) -> None:
    """Move each partition back to its first message in ``undone``, to be read again."""
    first: dict[tuple[str, int], int] = {}
    for message in undone:
        key = (message.topic() or "", message.partition() or 0)
        offset = message.offset() or 0
        first[key] = min(first.get(key, offset), offset)
    for (topic, partition), offset in first.items():
        # A partition revoked meanwhile is its new owner's to read from the committed offset.
        with suppress(KafkaException):
            consumer.seek(TopicPartition(topic, partition, offset))
