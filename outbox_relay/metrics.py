"""The relay's Prometheus metrics (names fixed by the design)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PUBLISHED = Counter("outbox_published_total", "Outbox rows delivered to Kafka")
PUBLISH_FAILURES = Counter(
    "outbox_publish_failures_total", "Deliveries Kafka refused or timed out", ["reason"]
)
ROWS_FAILED = Counter(
    "outbox_rows_failed_total", "Rows marked failed because they cannot be sent", ["reason"]
)
BACKLOG = Gauge("outbox_backlog_rows", "Rows of a slice waiting to be published", ["slice"])
FAILED_ROWS = Gauge("outbox_failed_rows", "Rows marked failed, waiting for a person")
AWAITING_TOPIC_ROWS = Gauge(
    "outbox_rows_awaiting_topic",
    "Rows set aside until their topic exists (failed unknown_topic past the grace)",
)
OLDEST_AGE = Gauge(
    "outbox_oldest_unpublished_age_seconds",
    "Age of a slice's oldest row waiting to be published",
    ["slice"],
)
RUNNING = Gauge(
    "outbox_running_transactions",
    "Transactions a slice's cursor passed while they were still running (their rows wait)",
    ["slice"],
)
RUNNING_AGE = Gauge(
    "outbox_oldest_running_transaction_age_seconds",
    "How long the oldest of a slice's remembered transactions has been running",
    ["slice"],
)
SLICE_GAUGES = (BACKLOG, OLDEST_AGE, RUNNING, RUNNING_AGE)
SLICES_OWNED = Gauge("outbox_slices_owned", "Slices this relay holds the lease of")
REPUBLISHED = Counter("outbox_republished_total", "Rows re-sent for republish requests")
REPUBLISH_REQUESTS = Counter(
    "outbox_republish_requests_total", "Republish requests handled", ["outcome"]
)
PURGED = Counter("outbox_purged_total", "Sent rows deleted past retention")
PUBLISH_LATENCY = Histogram(
    "outbox_publish_latency_seconds",
    "From the start of the transaction that wrote a batch's oldest row to Kafka's last ack",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
