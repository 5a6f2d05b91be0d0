"""After apply: everything one poll batch's outcomes still ask for, in one place and one order.

Letters first (refused events to the dead-letter topic, held ones to the held topic,
both flushed), then the dead letters recorded in PostgreSQL, then every metric (what
each route applied and ignored, the apply latency), and last the offsets the batch
may now commit. Anything that fails here fails before an offset is given, so the
batch is applied again after the outage, and its routes are idempotent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import psycopg
import structlog
from confluent_kafka import Producer, TopicPartition

from consumer import deadletter, metrics
from consumer.kinds import Applier, Outcome
from consumer.poll import Prepared, next_offsets
from consumer.settings import ConsumerSettings

log = structlog.get_logger(__name__)


def settle(
    conn: psycopg.Connection[Any],
    producer: Producer,
    settings: ConsumerSettings,
    prepared: Prepared,
    outcomes: Sequence[tuple[Applier, Outcome]],
) -> list[TopicPartition]:
    """Send and record the batch's letters, count it, and return the offsets it may commit."""
    refused = prepared.dead + prepared.letters([r for _, o in outcomes for r in o.refused])
    held = prepared.letters([h for _, o in outcomes for h in o.held])
    limit = settings.dead_letter_max_value_bytes
    deadletter.send(producer, settings.dead_letter_topic, refused, limit)
    deadletter.send(producer, settings.held_topic, held, limit)
    deadletter.record(conn, refused)
    count(prepared, outcomes)
    for dead in refused:
        log.warning(
            "event_dead_lettered",
            reason=dead.reason,
            detail=dead.detail[:200],
            topic=dead.message.topic(),
            partition=dead.message.partition(),
            offset=dead.message.offset(),
        )
    return next_offsets(prepared.messages)


def count(prepared: Prepared, outcomes: Sequence[tuple[Applier, Outcome]]) -> None:
    """Each route's applied and stale events, its kind's own counters, the apply latency.

    Latency is per entity: how late its state shows its newest event of this batch
    (events drained from parking arrived in an earlier batch and have no message here).
    """
    now = time.time()
    for applier, outcome in outcomes:
        outcome.count(applier.route.stream)
        newest = {e.entity_id: e for e in outcome.applied if e.event_id in prepared.by_event}
        for event in newest.values():
            sent_at = prepared.by_event[event.event_id].timestamp()[1] / 1000
            metrics.APPLY_LATENCY.observe(max(0.0, now - sent_at))
