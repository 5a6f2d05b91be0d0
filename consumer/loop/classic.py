"""The classic consumer group as the loop's source: partitions assigned, offsets committed.

Offsets are committed only past messages whose effects are durable (``done``) and
never past a held one. Commits go asynchronously at most every commit interval, and at
once when the consumer falls idle: a commit lost in a crash only means a redelivery.
Revoked partitions get their done offsets committed synchronously; lost ones nothing.
While paused on an outage the consumer keeps polling, so it stays in the group and
serves rebalances; a message that still arrives is sought back, never dropped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from consumer import metrics
from consumer.loop.offsets import Offsets, commit
from schemas.runtime import kafka_clients
from schemas.runtime.health import Health

if TYPE_CHECKING:
    from consumer.settings import ConsumerSettings

log = structlog.get_logger(__name__)

LAG_INTERVAL_S = 5.0


class ClassicGroup:
    """A ``Source`` over a Kafka consumer group (cooperative-sticky, or the broker's assignor)."""

    def __init__(self, settings: ConsumerSettings, topics: Sequence[str], health: Health) -> None:
        self.settings = settings
        self.topics = list(topics)
        self.health = health
        self.offsets = Offsets()
        self._consumer: Consumer | None = None
        self.paused = False
        self._next_commit = 0.0
        self._next_lag = 0.0
        self._lag_labels: set[tuple[str, str]] = set()

    @property
    def _kafka(self) -> Consumer:
        if self._consumer is None:
            raise KafkaException("Kafka consumer not started")
        return self._consumer

    # ------------------------------------------------------------------ membership

    def start(self) -> None:
        """Create the consumer and subscribe; readiness waits for an assignment."""
        self._consumer = kafka_clients.consumer(
            self.settings,
            "inorder-consumer",
            self.settings.group_id,
            tunables={
                # The broker answers a fetch as soon as one byte is there (fetch.min.bytes),
                # so these do not delay an event; they are set for what they do bound.
                "fetch.min.bytes": 1,
                # How long an empty fetch is held by the broker. A partition assigned or
                # resumed meanwhile joins the next fetch, so this bounds its first delay.
                "fetch.wait.max.ms": 100,
                # queued.min.messages stays at librdkafka's default (100,000 per partition):
                # above it, the next fetch waits fetch.queue.backoff.ms (1 s), which starved
                # the consumer of full batches (a quarter of the rate) when it was set lower.
            },
            fixed={"on_commit": self.offsets.failed},
            assignor="cooperative-sticky",
        )
        protocol = self.settings.group_protocol
        metrics.SOURCE.labels("group", protocol).set(1)
        self.health.note("source", f"consumer group {self.settings.group_id} ({protocol} protocol)")
        self._consumer.subscribe(
            self.topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def close(self) -> None:
        """Commit what is done, synchronously, and leave the group."""
        if self._consumer is None:
            return
        commit(self._consumer, self.offsets.pending(), wait=True)
        self._consumer.close()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("partitions_assigned", partitions=[f"{p.topic}:{p.partition}" for p in partitions])
        self.offsets.assigned(partitions)
        consumer.incremental_assign(partitions)
        if self.paused:  # a batch waiting on an outage: they wait with it
            consumer.pause(partitions)
        self._ready_if_assigned()

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # What is done is committed now; a batch still waiting on a dependency drops these
        # partitions' messages, and their new owner reads them from the committed offset.
        log.info("partitions_revoked", partitions=[f"{p.topic}:{p.partition}" for p in partitions])
        commit(self._kafka, self.offsets.pending(partitions), wait=True)
        self._forget(partitions)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another member may own these already: commit nothing for them.
        log.warning("partitions_lost", partitions=[f"{p.topic}:{p.partition}" for p in partitions])
        self._forget(partitions)

    def _forget(self, partitions: list[TopicPartition]) -> None:
        self.offsets.forget(partitions)
        for p in partitions:
            label = (p.topic, str(p.partition))
            if label in self._lag_labels:
                metrics.LAG.remove(*label)
                self._lag_labels.discard(label)
        self._ready_if_assigned()

    def _ready_if_assigned(self) -> None:
        if self._consumer is not None and self._consumer.assignment():
            self.health.cleared("assignment")
        else:
            self.health.blocked("assignment", "no partitions assigned")

    # ------------------------------------------------------------------ messages

    def take(self, most: int, wait_s: float, linger_s: float) -> list[Message]:
        """The next poll batch (see ``take``)."""
        return take(self._kafka, most, wait_s, linger_s)

    def tick(self) -> None:
        """Commit again what failed to commit, and keep the lag gauge current."""
        commit(self._kafka, self.offsets.take_retries(), wait=False)
        now = time.monotonic()
        if now >= self._next_lag:
            self._next_lag = now + LAG_INTERVAL_S
            self._lag()

    def ours(self, message: Message) -> bool:
        """True while the message's partition is still assigned to us."""
        return self.offsets.ours(message)

    def done(self, messages: Sequence[Message]) -> None:
        """Past each partition's last message of ``messages`` may be committed."""
        self.offsets.done(next_offsets(messages))

    def hold(self, message: Message) -> None:
        """No commit passes ``message`` until it is released."""
        self.offsets.hold(message)

    def release(self, message: Message) -> None:
        """Commits may pass ``message`` again."""
        self.offsets.release(message)

    def settle(self, *, idle: bool) -> None:
        """Hand the done offsets to Kafka, at most every commit interval or once idle.

        Every commit is a write to the group's offsets topic; under a steady stream one
        per batch was most of the broker's requests. The effects are committed already,
        so the offsets may go asynchronously and a little later.
        """
        now = time.monotonic()
        if not idle and now < self._next_commit:
            return
        offsets = self.offsets.take_unsent()
        if offsets:
            commit(self._kafka, offsets, wait=False)
            self._next_commit = now + self.settings.commit_interval_ms / 1000

    # ------------------------------------------------------------------ outages

    def pause(self) -> None:
        """Commit what is done and pause every assigned partition."""
        consumer = self._kafka
        # A paused consumer is idle: what it applied before the outage is committed now,
        # not left to a revoke or to the end of the outage.
        commit(consumer, self.offsets.take_unsent(), wait=False)
        assignment = consumer.assignment()
        if assignment:
            consumer.pause(assignment)
        self.paused = True

    def resume(self) -> None:
        """Resume the assignment (a no-op when nothing was paused)."""
        if not self.paused or self._consumer is None:
            return
        assignment = self._consumer.assignment()
        if assignment:
            self._consumer.resume(assignment)
        self.paused = False

    def idle(self, deadline: float) -> None:
        """Poll while paused: stay in the group, serve rebalances, lose nothing."""
        if self._consumer is None:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            return
        # Paused partitions return nothing, and anything that does arrive is fetched again later.
        for message in self._consumer.consume(num_messages=1, timeout=0.2):
            if message.error() is None:
                where = TopicPartition(
                    message.topic() or "", message.partition() or 0, message.offset() or 0
                )
                self._consumer.seek(where)
                self._consumer.pause([where])

    def _lag(self) -> None:
        consumer = self._kafka
        assignment = consumer.assignment()
        if not assignment:
            return
        for position in consumer.position(assignment):
            _, high = consumer.get_watermark_offsets(position, cached=True)
            if position.offset >= 0 and high >= 0:
                label = (position.topic, str(position.partition))
                metrics.LAG.labels(*label).set(high - position.offset)
                self._lag_labels.add(label)


def take(consumer: Consumer, most: int, wait_s: float, linger_s: float) -> list[Message]:
    """The next poll batch: what has arrived, without waiting for more.

    Blocks only while nothing at all has been fetched (up to ``wait_s``); once one
    message is there, takes what else is already in the local queue, up to
    ``most``. A quiet topic is handled event by event and a backlog still comes
    in full batches, so batching costs latency only when there is something to batch.
    ``linger_s`` > 0 waits instead up to that long after the first message for the
    batch to fill.
    """
    first = consumer.consume(num_messages=1, timeout=wait_s)
    if not first or most == 1:
        return list(first)
    return [*first, *consumer.consume(num_messages=most - 1, timeout=linger_s)]


def next_offsets(messages: Sequence[Message]) -> list[TopicPartition]:
    """The offsets to commit once every message of the batch is done: last + 1 per partition."""
    last: dict[tuple[str, int], int] = {}
    for message in messages:
        key = (message.topic() or "", message.partition() or 0)
        last[key] = max(last.get(key, -1), message.offset() or 0)
    return [TopicPartition(t, p, o + 1) for (t, p), o in sorted(last.items())]
