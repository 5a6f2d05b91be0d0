"""The consumer's Prometheus metrics (names fixed by the design)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CONSUMED = Counter("events_consumed_total", "Messages taken from Kafka")
APPLIED = Counter("events_applied_total", "Events whose effect was applied", ["route"])
STALE = Counter(
    "events_stale_total", "Events ignored because a newer or equal version was applied",
    ["event_type"],
)  # fmt: skip
DEAD_LETTERED = Counter(
    "events_dead_lettered_total", "Messages sent to the dead-letter topic", ["reason"]
)
BATCH_SIZE = Histogram(
    "consumer_batch_size", "Messages per poll batch",
    buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000),
)  # fmt: skip
BATCH_DURATION = Histogram(
    "consumer_batch_duration_seconds", "Time to apply and commit one poll batch",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)  # fmt: skip
APPLY_LATENCY = Histogram(
    "event_apply_latency_seconds", "From the message's Kafka timestamp to its effect committed",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)  # fmt: skip
PARKED = Counter(
    "events_parked_total", "Early events parked waiting for a predecessor", ["event_type"]
)
REORDER_DISTANCE = Histogram(
    "event_reorder_distance", "How far ahead of the next expected seq an early event arrived",
    buckets=(1, 2, 3, 5, 10, 25, 100, 1000),
)  # fmt: skip
GAPS_ESCALATED = Counter(
    "event_gaps_escalated_total", "Gaps escalated (deadline passed or parking cap reached)",
    ["event_type"],
)  # fmt: skip
NEEDS_REVIEW = Gauge("steps_needs_review", "Step entities stopped until a person looks at them")
PARKED_CURRENT = Gauge("events_parked_current", "Events parked now, over all routes and entities")
PARKED_OLDEST_AGE = Gauge(
    "events_parked_oldest_age_seconds", "Age of the oldest park, by the consumers' clock"
)
GAPS_OPEN = Gauge("gaps_open", "Gaps by status", ["status"])
GAP_HEAL_TIME = Histogram(
    "gap_time_to_heal_seconds", "From a gap's detection to its range being applied",
    buckets=(1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 7200),
)  # fmt: skip
REPUBLISH_REQUESTED = Counter("republish_requests_sent_total", "Republish requests sent")
SWEEP_DURATION = Histogram(
    "sweep_duration_seconds", "One sweep over every route's overdue entities",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)  # fmt: skip
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
