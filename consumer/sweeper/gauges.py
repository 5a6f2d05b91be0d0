"""Gauges over every entity, exported by the active sweeper only: parked events, gaps, batches."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from consumer import metrics
from consumer.kinds.batches.decisions import BatchStatus, ItemState
from consumer.kinds.steps.parking import ParkingLot
from consumer.sweeper import gaps
from consumer.sweeper.gaps import GapStatus


def export_parked(lot: ParkingLot, streams: list[str]) -> None:
    """Events parked now over every step route, and the age of the oldest park."""
    total, oldest = 0, None
    for stream in streams:
        for _, size, since in lot.sizes(stream):
            total += size
            oldest = since if oldest is None else min(oldest, since)
    metrics.PARKED_CURRENT.set(total)
    metrics.PARKED_OLDEST_AGE.set(time.time() - oldest if oldest else 0)


def export_gaps(conn: psycopg.Connection[Any]) -> None:
    """Gaps by status."""
    counts = gaps.status_counts(conn)
    for status in GapStatus:
        metrics.GAPS_OPEN.labels(status).set(counts.get(status, 0))


def export_batches(conn: psycopg.Connection[Any]) -> None:
    """Positions still pending in waiting batches, and batches held for a person."""
    pending, held = conn.execute(
        "SELECT (SELECT count(*) FROM inorder_batch_items AS i JOIN inorder_batches AS b "
        "USING (route, batch_id) WHERE b.status = %s AND i.state = %s), "
        "(SELECT count(*) FROM inorder_batches WHERE status = %s)",
        (BatchStatus.WAITING, ItemState.PENDING, BatchStatus.HELD),
    ).fetchone() or (0, 0)
    metrics.BATCH_ITEMS_PENDING.set(pending)
    metrics.BATCHES_HELD.set(held)
