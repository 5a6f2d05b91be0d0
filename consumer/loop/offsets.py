"""Offset bookkeeping: what is done per partition, what was taken away, and committing it."""

from __future__ import annotations

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

log = structlog.get_logger(__name__)


class Offsets:
    """Next offset per partition whose effects are committed, and partitions no longer ours.

    A message whose work goes on past its poll batch is ``hold``-ed: no offset handed to
    a commit passes it until it is ``release``-d, whatever later batches finished.
    """

    def __init__(self) -> None:
        self._done: dict[tuple[str, int], int] = {}
        # Offsets of messages still being worked on, per partition.
        self._held: dict[tuple[str, int], set[int]] = {}
        self.revoked: set[tuple[str, int]] = set()
        # Partitions whose last asynchronous commit failed; committed again on the next poll.
        self.retry: set[tuple[str, int]] = set()
        # Partitions with done offsets not yet handed to a commit.
        self._unsent: set[tuple[str, int]] = set()

    def assigned(self, partitions: list[TopicPartition]) -> None:
        """Partitions (back) in our hands."""
        self.revoked -= {(p.topic, p.partition) for p in partitions}

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Partitions taken away: nothing more is committed or applied for them."""
        for p in partitions:
            self.revoked.add((p.topic, p.partition))
            self._done.pop((p.topic, p.partition), None)
            self._held.pop((p.topic, p.partition), None)
            self._unsent.discard((p.topic, p.partition))

    def ours(self, message: Message) -> bool:
        """True while the message's partition is still assigned to us."""
        return (message.topic(), message.partition()) not in self.revoked

    def done(self, offsets: list[TopicPartition]) -> None:
        """Record offsets whose effects are committed."""
        for tp in offsets:
            self._done[(tp.topic, tp.partition)] = tp.offset
            self._unsent.add((tp.topic, tp.partition))

    def hold(self, message: Message) -> None:
        """No commit passes ``message`` until it is released (its work goes on)."""
        key = (message.topic() or "", message.partition() or 0)
        if key not in self.revoked:
            self._held.setdefault(key, set()).add(message.offset() or 0)

    def release(self, message: Message) -> None:
        """``message``'s work is done: commits may pass it."""
        key = (message.topic() or "", message.partition() or 0)
        held = self._held.get(key)
        if held is None:
            return
        held.discard(message.offset() or 0)
        if not held:
            del self._held[key]
        if key in self._done:
            self._unsent.add(key)

    def held(self) -> int:
        """Messages held now."""
        return sum(map(len, self._held.values()))

    def _next(self, key: tuple[str, int]) -> int:
        """The offset a commit may give for the partition: done, but never past a held one."""
        held = self._held.get(key)
        return min(self._done[key], *held) if held else self._done[key]

    def take_unsent(self) -> list[TopicPartition]:
        """Done offsets not yet committed (nor being committed); clears the list."""
        unsent = [TopicPartition(t, p, self._next((t, p))) for t, p in sorted(self._unsent)]
        self._unsent.clear()
        return unsent

    def pending(self, partitions: list[TopicPartition] | None = None) -> list[TopicPartition]:
        """Done offsets, for all partitions or the given ones."""
        wanted = None if partitions is None else {(p.topic, p.partition) for p in partitions}
        return [
            TopicPartition(topic, partition, self._next((topic, partition)))
            for topic, partition in self._done
            if wanted is None or (topic, partition) in wanted
        ]

    def failed(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Commit callback: remember partitions whose commit failed (a rebalance, say).

        Their effects are applied; without a second commit the stored offset would stay
        behind until the partition's next message.
        """
        failed = [p for p in partitions if p.error is not None] or (partitions if err else [])
        if failed:
            self.retry |= {(p.topic, p.partition) for p in failed}
            log.warning(
                "offset_commit_failed",
                error=str(err or failed[0].error),
                partitions=[f"{p.topic}:{p.partition}@{p.offset}" for p in failed],
            )

    def take_retries(self) -> list[TopicPartition]:
        """Done offsets of the partitions to commit again, still ours; clears the list."""
        wanted = [TopicPartition(t, p) for t, p in self.retry if (t, p) not in self.revoked]
        self.retry.clear()
        return self.pending(wanted) if wanted else []


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
