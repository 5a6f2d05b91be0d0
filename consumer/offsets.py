"""Offset bookkeeping: what is done per partition, what was taken away, and committing it."""

from __future__ import annotations

import structlog
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

log = structlog.get_logger(__name__)


class Offsets:
    """Next offset per partition whose effects are committed, and partitions no longer ours."""

    def __init__(self) -> None:
        self._done: dict[tuple[str, int], int] = {}
        self.revoked: set[tuple[str, int]] = set()

    def assigned(self, partitions: list[TopicPartition]) -> None:
        """Partitions (back) in our hands."""
        self.revoked -= {(p.topic, p.partition) for p in partitions}

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Partitions taken away: nothing more is committed or applied for them."""
        for p in partitions:
            self.revoked.add((p.topic, p.partition))
            self._done.pop((p.topic, p.partition), None)

    def ours(self, message: Message) -> bool:
        """True while the message's partition is still assigned to us."""
        return (message.topic(), message.partition()) not in self.revoked

    def done(self, offsets: list[TopicPartition]) -> None:
        """Record offsets whose effects are committed."""
        for tp in offsets:
            self._done[(tp.topic, tp.partition)] = tp.offset

    def pending(self, partitions: list[TopicPartition] | None = None) -> list[TopicPartition]:
        """Done offsets, for all partitions or the given ones."""
        wanted = None if partitions is None else {(p.topic, p.partition) for p in partitions}
        return [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in self._done.items()
            if wanted is None or (topic, partition) in wanted
        ]


def commit(consumer: Consumer, offsets: list[TopicPartition], *, wait: bool) -> None:
    """Commit offsets; a failure is logged, since a lost commit only means a redelivery."""
    if not offsets:
        return
    try:
        if wait:
            consumer.commit(offsets=offsets, asynchronous=False)
        else:
            consumer.commit(offsets=offsets, asynchronous=True)
    except KafkaException as exc:
        log.warning("offset_commit_failed", error=str(exc.args[0]))
