"""Waiting out an outage without leaving the group: pause the assignment, keep polling, resume.

While PostgreSQL, Redis or Kafka is down the batch in hand is kept and retried; the
assignment is paused so nothing new arrives, but the consumer keeps polling so it stays
in the group and serves rebalances. A message that still arrives is sought back and
fetched again after the pause, never dropped. What was applied before the outage is
committed as the pause starts.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from consumer import metrics
from consumer.loop.offsets import Offsets, commit
from schemas.runtime.outages import Outages


class Pausing:
    """One consumer's pause on outages; ``consumer`` is set once Kafka is started."""

    def __init__(self, offsets: Offsets, outages: Outages) -> None:
        self.offsets = offsets
        self.outages = outages
        self.consumer: Consumer | None = None
        self.paused = False

    @property
    def _kafka(self) -> Consumer:
        if self.consumer is None:
            raise KafkaException("Kafka consumer not started")
        return self.consumer

    def pause(self) -> None:
        """Commit what is done, pause every assigned partition, show it in the gauge."""
        consumer = self._kafka
        # A paused consumer is idle: what it applied before the outage is committed now,
        # not left to a revoke or to the end of the outage.
        commit(consumer, self.offsets.take_unsent(), wait=False)
        assignment = consumer.assignment()
        if assignment:
            consumer.pause(assignment)
        self.paused = True
        metrics.PAUSED.set(1)

    def resume(self) -> None:
        """The outage is over: resume the assignment (a no-op when nothing was paused)."""
        self.outages.recovered()
        if not self.paused:
            return
        consumer = self._kafka
        assignment = consumer.assignment()
        if assignment:
            consumer.resume(assignment)
        self.paused = False
        metrics.PAUSED.set(0)

    def assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions assigned during a pause wait with the others."""
        if self.paused:
            consumer.pause(partitions)

    def wait(self, exc: BaseException) -> None:
        """Back off once for ``exc``, polling meanwhile (the outage's own backoff)."""
        self.outages.wait(exc, paused=True, waiting=self._keep_polling)

    def _keep_polling(self, deadline: float) -> None:
        """While waiting out an outage: stay in the group, serve rebalances, lose nothing."""
        if self.consumer is None:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            return
        # Paused partitions return nothing, and anything that does arrive is fetched again later.
        for message in self.consumer.consume(num_messages=1, timeout=0.2):
            if message.error() is None:
                self._put_back(message)

    def _put_back(self, message: Message) -> None:
        """Fetch ``message`` again once consumption resumes, instead of dropping it."""
        where = TopicPartition(
            message.topic() or "", message.partition() or 0, message.offset() or 0
        )
        self._kafka.seek(where)
        self._kafka.pause([where])
