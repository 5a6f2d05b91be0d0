"""The consumer's Prometheus metrics (names fixed by the design), and the gauges it refreshes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import Counter, Gauge, Histogram

LAG_INTERVAL_S = 5.0
# Entities stopped by another replica or released by a person show within this long; one
# this consumer stops shows at its next poll.
REVIEW_INTERVAL_S = 5.0
# Set when this process stopped an entity: the review gauge is refreshed at the next poll.
_reviews_changed = threading.Event()

CONSUMED = Counter("events_consumed_total", "Messages taken from Kafka")
APPLIED = Counter("events_applied_total", "Events whose effect was applied", ["route"])
STALE = Counter(
    "events_stale_total",
    "Events ignored because a newer or equal version was applied",
    ["event_type"],
)
DEAD_LETTERED = Counter(
    "events_dead_lettered_total", "Messages sent to the dead-letter topic", ["reason"]
)
BATCH_SIZE = Histogram(
    "consumer_batch_size",
    "Messages per poll batch",
    buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000),
)
BATCH_DURATION = Histogram(
    "consumer_batch_duration_seconds",
    "Time to apply and commit one poll batch",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
APPLY_LATENCY = Histogram(
    "event_apply_latency_seconds",
    "From the Kafka timestamp of an entity's newest event in a batch to its effect committed",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
PARKED = Counter(
    "events_parked_total", "Early events parked waiting for a predecessor", ["event_type"]
)
REORDER_DISTANCE = Histogram(
    "event_reorder_distance",
    "Early events by how far past the next expected seq they arrived: seq - last applied - 1 "
    "(8 after 6 is 1; in a new generation, the seq itself)",
    buckets=(1, 2, 3, 5, 10, 25, 100, 1000),
)
GAPS_ESCALATED = Counter(
    "event_gaps_escalated_total",
    "Gaps escalated (deadline passed or parking cap reached)",
    ["event_type"],
)
NEEDS_REVIEW = Gauge(
    "steps_needs_review",
    "Step entities stopped until a person looks at them (over every replica; refreshed at the "
    "next poll after this consumer stops one, and every 5 s)",
)
RETRYING = Gauge(
    "steps_retrying",
    "Step entities waiting for a failed step's next call (a handler's retry table; over "
    "every replica, refreshed with steps_needs_review)",
)
RETRIES = Counter(
    "step_retries_total",
    "Failed step calls that will be made again after their backoff",
    ["route", "event_type"],
)
RETRIES_EXHAUSTED = Counter(
    "step_retries_exhausted_total",
    "Steps given up on after their last call, by what the route says then "
    "(stop, dead_letter or skip)",
    ["route", "event_type", "then"],
)
LANE_EVENTS = Gauge(
    "steps_lane_events",
    "Step events taken into lanes and not yet applied or parked: the loop commits no offset "
    "past them (a handler that hangs keeps this up)",
    ["route"],
)
LANE_OLDEST_AGE = Gauge(
    "steps_lane_oldest_age_seconds",
    "How long the oldest step event in a lane has waited to be applied or parked (0: none); "
    "a call that hangs makes it grow",
    ["route"],
)
STOPPED = Counter(
    "steps_stopped_total", "Step entities this consumer stopped for a person", ["route"]
)
PARKED_CURRENT = Gauge("events_parked_current", "Events parked now, over all routes and entities")
PARKED_OLDEST_AGE = Gauge(
    "events_parked_oldest_age_seconds", "Age of the oldest park, by the consumers' clock"
)
GAPS_OPEN = Gauge("gaps_open", "Gaps by status", ["status"])
GAP_HEAL_TIME = Histogram(
    "gap_time_to_heal_seconds",
    "From a gap's detection to its range being applied",
    buckets=(1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 7200),
)
REPUBLISH_REQUESTED = Counter("republish_requests_sent_total", "Republish requests sent")
REPUBLISH_RESULTS = Counter(
    "republish_results_total",
    "Republish results the sweeper read, by outcome: used, unmatched (answers no open request: "
    "ignored) or invalid (committed, never retried)",
    ["outcome"],
)
SWEEP_DURATION = Histogram(
    "sweep_duration_seconds",
    "One sweep over every route's overdue entities",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)
SWEEPER_ACTIVE = Gauge("sweeper_active", "1 while this sweeper holds the lease")
LAG = Gauge("consumer_lag", "Messages behind the end of the partition", ["topic", "partition"])
PAUSED = Gauge("consumer_paused", "1 while consumption is paused on a dependency")
BATCHES_ASSEMBLED = Counter(
    "batches_assembled_total", "Batch assemblies written (each revision counts)", ["outcome"]
)
BATCHES_INCONSISTENT = Counter(
    "batches_inconsistent_total", "Batches stopped as inconsistent or halted (manifest changed)"
)
BATCH_RESULTS = Counter(
    "batch_results_total", "Worker results and what they did to their position", ["verdict"]
)
BATCH_ITEMS_PENDING = Gauge("batch_items_pending", "Positions still pending in waiting batches")
BATCHES_HELD = Gauge("batches_held", "Batches held for a person to decide")


def entity_stopped(route: str, n: int = 1) -> None:
    """Count stopped entities and have the review gauge refreshed at the next poll."""
    STOPPED.labels(route).inc(n)
    _reviews_changed.set()


def reviews_changed() -> None:
    """Have the review and retry gauges refreshed at the next poll."""
    _reviews_changed.set()


class Gauges:
    """Keeps the lag and review gauges current without querying on every poll."""

    def __init__(self, *, tables: Sequence[Callable[[psycopg.Connection[Any]], None]]) -> None:
        # The route kinds' gauges over their tables (the steps' stopped entities).
        self._tables = list(tables)
        self._labels: set[tuple[str, str]] = set()
        self._next_lag = 0.0
        self._next_review = 0.0

    def refresh(self, consumer: Consumer | None, conn: psycopg.Connection[Any] | None) -> None:
        """Update whichever gauges are due."""
        now = time.monotonic()
        if consumer is not None and now >= self._next_lag:
            self._next_lag = now + LAG_INTERVAL_S
            self._lag(consumer)
        due = now >= self._next_review or _reviews_changed.is_set()
        if self._tables and conn is not None and due:
            _reviews_changed.clear()
            self._next_review = now + REVIEW_INTERVAL_S
            for refresh in self._tables:
                refresh(conn)

    def drop(self, partitions: list[TopicPartition]) -> None:
        """Stop reporting lag for partitions that are no longer ours."""
        for p in partitions:
            label = (p.topic, str(p.partition))
            if label in self._labels:
                LAG.remove(*label)
                self._labels.discard(label)

    def _lag(self, consumer: Consumer) -> None:
        assignment = consumer.assignment()
        if not assignment:
            return
        for position in consumer.position(assignment):
            _, high = consumer.get_watermark_offsets(position, cached=True)
            if position.offset >= 0 and high >= 0:
                label = (position.topic, str(position.partition))
                LAG.labels(*label).set(high - position.offset)
                self._labels.add(label)
