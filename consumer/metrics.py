"""The consumer's Prometheus metrics (names fixed by the design), and the gauges it refreshes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from prometheus_client import Counter, Gauge, Histogram

# How often the kinds' gauges over their tables are refreshed (what another replica or a
# person changed shows within this long); a change this process makes shows at its next poll.
TABLES_INTERVAL_S = 5.0
# Set when this process changed what a kind's table gauges show.
_gauges_due = threading.Event()

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
POLL_SIZE = Histogram(
    "consumer_batch_size",
    "Messages per poll batch",
    buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000),
)
POLL_DURATION = Histogram(
    "consumer_batch_duration_seconds",
    "Time to apply and commit one poll batch",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
APPLY_LATENCY = Histogram(
    "event_apply_latency_seconds",
    "From the Kafka timestamp of an entity's newest event in a batch to its effect committed",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
REPUBLISH_RESULTS = Counter(
    "republish_results_total",
    "Republish results the sweeper read, by outcome: used, unmatched (answers no open request: "
    "ignored) or invalid (committed, never retried)",
    ["outcome"],
)
HISTORY_DELETED = Counter(
    "history_rows_deleted_total",
    "Rows of the consumer's history deleted past INORDER_HISTORY_RETENTION_S",
    ["table"],
)
SWEEP_DURATION = Histogram(
    "sweep_duration_seconds",
    "One sweep over every route's overdue entities",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)
SWEEPER_ACTIVE = Gauge("sweeper_active", "1 while this sweeper holds the lease")
LAG = Gauge("consumer_lag", "Messages behind the end of the partition", ["topic", "partition"])
PAUSED = Gauge("consumer_paused", "1 while consumption is paused on a dependency")
SOURCE = Gauge(
    "consumer_source_info",
    "1 for how this consumer reads: mode group (protocol classic or consumer) or share",
    ["mode", "protocol"],
)
SHARE_ACQUIRED = Counter(
    "share_records_acquired_total",
    "Records this share-group member acquired, by delivery: first, again (redelivered), or "
    "last (the group's delivery-count limit reached: a record that cannot be applied before "
    "its lock runs out is dead-lettered, never left to be archived)",
    ["delivery"],
)
SHARE_RELEASED = Counter(
    "share_records_released_total",
    "Records handed back to the share group unapplied, by why: lock (its acquisition lock "
    "was running out), outage (a dependency stayed down) or close",
    ["why"],
)
SHARE_UNLETTERED = Counter(
    "share_records_unlettered_total",
    "Records on their last delivery that could not be dead-lettered before their lock ran "
    "out (Kafka refused the letter): the broker archives them; page on any",
)
SHARE_IN_HAND = Gauge(
    "share_records_in_hand", "Records acquired by this member and not yet acknowledged"
)


def gauges_due() -> None:
    """Have the kinds' table gauges refreshed at the next poll (this process changed them)."""
    _gauges_due.set()


class Gauges:
    """Keeps the kinds' table gauges current without querying on every poll."""

    def __init__(self, *, tables: Sequence[Callable[[psycopg.Connection[Any]], None]]) -> None:
        # The route kinds' gauges over their tables (the steps' stopped entities).
        self._tables = list(tables)
        self._next = 0.0

    def refresh(self, conn: psycopg.Connection[Any] | None) -> None:
        """Update the gauges when they are due (or this process changed them)."""
        now = time.monotonic()
        due = now >= self._next or _gauges_due.is_set()
        if self._tables and conn is not None and due:
            _gauges_due.clear()
            self._next = now + TABLES_INTERVAL_S
            for refresh in self._tables:
                refresh(conn)
