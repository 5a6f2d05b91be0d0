"""Gauges the consumer refreshes now and then: lag per partition, step entities awaiting review."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from consumer import metrics

LAG_INTERVAL_S = 5.0
REVIEW_INTERVAL_S = 30.0


class Gauges:
    """Keeps the lag and review gauges current without querying on every poll."""

    def __init__(self, *, steps: bool) -> None:
        self._steps = steps
        self._labels: set[tuple[str, str]] = set()
        self._next_lag = 0.0
        self._next_review = 0.0

    def refresh(self, consumer: Consumer | None, conn: psycopg.Connection[Any] | None) -> None:
        """Update whichever gauges are due."""
        now = time.monotonic()
        if consumer is not None and now >= self._next_lag:
            self._next_lag = now + LAG_INTERVAL_S
            self._lag(consumer)
        if self._steps and conn is not None and now >= self._next_review:
            self._next_review = now + REVIEW_INTERVAL_S
            self._reviews(conn)

    def drop(self, partitions: list[TopicPartition]) -> None:
        """Stop reporting lag for partitions that are no longer ours."""
        for p in partitions:
            label = (p.topic, str(p.partition))
            if label in self._labels:
                metrics.LAG.remove(*label)
                self._labels.discard(label)

    def _lag(self, consumer: Consumer) -> None:
        assignment = consumer.assignment()
        if not assignment:
            return
        for position in consumer.position(assignment):
            _, high = consumer.get_watermark_offsets(position, cached=True)
            if position.offset >= 0 and high >= 0:
                label = (position.topic, str(position.partition))
                metrics.LAG.labels(*label).set(high - position.offset)
                self._labels.add(label)

    @staticmethod
    def _reviews(conn: psycopg.Connection[Any]) -> None:
        try:
            row = conn.execute(
                "SELECT count(*) FROM inorder_step_progress WHERE stopped_at_seq IS NOT NULL"
            ).fetchone()
        except psycopg.OperationalError:
            return  # the next batch notices and pauses
        metrics.NEEDS_REVIEW.set(row[0] if row else 0)
