"""What the active sweeper does for batch routes: expire batches past their deadline, and
dead-letter results whose batch's manifest did not come within the route's TTL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import orjson

from consumer import deadletter
from consumer.deadletter import DeadLetter, Unsent
from consumer.kinds._plugin import Answered, Duties, SweepReport
from consumer.kinds._resources import Resources
from consumer.kinds.batches import metrics
from consumer.kinds.batches.errors import BATCH_REJECTED
from consumer.kinds.batches.route import BatchRoute
from consumer.kinds.batches.runner import BatchRunner
from consumer.kinds.batches.store import Early
from schemas import DecodeError, decode, kafka_key
from schemas.batches import BatchStatus, ItemState, item_entity_id
from schemas.republish import RepublishResult

if TYPE_CHECKING:
    from consumer.settings import SweeperSettings

# Positions still pending in waiting batches, and batches held for a person.
_GAUGES = (
    "SELECT (SELECT count(*) FROM inorder_batch_items AS i JOIN inorder_batches AS b "
    "USING (route, batch_id) WHERE b.status = %s AND i.state = %s), "
    "(SELECT count(*) FROM inorder_batches WHERE status = %s)"
)


class BatchDuties(Duties):
    """Batch expiry: past its deadline a waiting batch stops waiting and is settled."""

    def __init__(self, routes: Sequence[BatchRoute], tools: Resources[SweeperSettings]) -> None:
        self.tools = tools
        self.runner = BatchRunner(routes)

    def sweep(self, report: SweepReport) -> None:
        """Expire each route's overdue batches and old early results (at most
        ``max_overdue_per_sweep`` of each per route)."""
        limit = self.tools.settings.max_overdue_per_sweep
        for stream, route in self.runner.routes.items():
            for share in self.runner.expire(self.tools.conn, stream, limit):
                share.outcome().count(stream)
                report["batches_expired"] += sum(share.assembled.values()) + share.inconsistent
            report["early_results_expired"] += self._expire_early(route, limit)

    def _expire_early(self, route: BatchRoute, limit: int) -> int:
        """Dead-letter the route's results kept past its TTL for a manifest that never came.

        Removed and lettered in one transaction: Kafka down, nothing is removed.
        """
        conn, store = self.tools.conn, self.runner.stores[route.stream]
        with conn.transaction():
            old = store.expire_early(conn, route.early_results_ttl_s, limit)
            if old:
                letters = [_letter(route, row) for row in old]
                deadletter.deliver(conn, self.tools.producer, self.tools.settings, letters)
        return len(old)

    def answer(self, result: RepublishResult) -> Answered:
        """Unmatched: batch routes ask the relay for nothing."""
        return Answered.UNMATCHED

    def gauges(self, *, every: bool) -> None:
        """Pending positions in waiting batches and batches held, when all gauges are due."""
        if not every:
            return
        pending, held = self.tools.conn.execute(
            _GAUGES, (BatchStatus.WAITING, ItemState.PENDING, BatchStatus.HELD)
        ).fetchone() or (0, 0)
        metrics.BATCH_ITEMS_PENDING.set(pending)
        metrics.BATCHES_HELD.set(held)


def _letter(route: BatchRoute, row: Early) -> DeadLetter:
    """The dead letter of one expired early result: its envelope, when kept."""
    batch_id, event_id, attempt, event_type, payload, message = row
    why = (
        f"no manifest for batch {batch_id!r} came within early_results_ttl_s "
        f"({route.early_results_ttl_s} s) of this result"
    )
    if message is not None:
        try:
            event = decode(message, max_bytes=len(message) + 1)
        except DecodeError:
            pass
        else:
            return DeadLetter(Unsent.of(event, message), BATCH_REJECTED, why, event)
    # Kept before envelopes were: the result as stored, keyed by its position's entity.
    position = payload.get("position", -1) if isinstance(payload, dict) else -1
    entity = item_entity_id(batch_id, position if isinstance(position, int) else -1)
    value = orjson.dumps(
        {"event_id": event_id, "event_type": event_type, "attempt": attempt, "payload": payload}
    )
    key = kafka_key(route.result_stream, entity)
    return DeadLetter(Unsent(key, message or value), BATCH_REJECTED, why)


def duties(routes: Sequence[BatchRoute], tools: Resources[SweeperSettings]) -> BatchDuties:
    """The batch kind's duties over its routes."""
    return BatchDuties(routes, tools)
