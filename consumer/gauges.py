"""Gauges refreshed now and then: consumer lag and reviews; parked events, gaps and batches.

The consumer keeps a ``Gauges``; the active sweeper calls the ``export_*`` functions,
so that counts over every entity are exported by one process only.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from consumer import gaps, metrics
from consumer.parking import ParkingLot

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


def export_parked(lot: ParkingLot, streams: list[str]) -> None:
    """Events parked now over every step route, and the age of the oldest park."""
    total, oldest = 0, None
    for stream in streams:
        index = lot.index_key(stream)
        members: list[bytes] = list(lot.client.zrange(index, 0, -1))  # type: ignore[arg-type]
        with lot.client.pipeline(transaction=False) as pipe:
            for entity in members:
                pipe.zcard(lot.entity_key(stream, entity.decode()))
            total += sum(pipe.execute())
        first: list[tuple[bytes, float]] = lot.client.zrange(index, 0, 0, withscores=True)  # type: ignore[assignment]
        if first:
            oldest = min(oldest or first[0][1], first[0][1])
    metrics.PARKED_CURRENT.set(total)
    metrics.PARKED_OLDEST_AGE.set(time.time() - oldest if oldest else 0)


def export_gaps(conn: psycopg.Connection[Any]) -> None:
    """Gaps by status."""
    counts = gaps.status_counts(conn)
    for status in ("open", "requested", "healed", "unrecoverable", "skipped"):
        metrics.GAPS_OPEN.labels(status).set(counts.get(status, 0))


def export_batches(conn: psycopg.Connection[Any]) -> None:
    """Positions still pending in waiting batches, and batches held for a person."""
    pending, held = conn.execute(
        "SELECT (SELECT count(*) FROM inorder_batch_items AS i JOIN inorder_batches AS b "
        "USING (route, batch_id) WHERE b.status = 'waiting' AND i.state = 'pending'), "
        "(SELECT count(*) FROM inorder_batches WHERE status = 'held')"
    ).fetchone() or (0, 0)
    metrics.BATCH_ITEMS_PENDING.set(pending)
    metrics.BATCHES_HELD.set(held)
