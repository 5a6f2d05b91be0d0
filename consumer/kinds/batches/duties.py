"""What the active sweeper does for batch routes: expire batches past their deadline."""

from __future__ import annotations

from collections.abc import Sequence

from consumer import metrics
from consumer.kinds._plugin import Answered, SweepReport, Tools
from consumer.kinds.batches.route import BatchRoute
from consumer.kinds.batches.runner import BatchRunner
from schemas.batches import BatchStatus, ItemState
from schemas.republish import RepublishResult

# Positions still pending in waiting batches, and batches held for a person.
_GAUGES = (
    "SELECT (SELECT count(*) FROM inorder_batch_items AS i JOIN inorder_batches AS b "
    "USING (route, batch_id) WHERE b.status = %s AND i.state = %s), "
    "(SELECT count(*) FROM inorder_batches WHERE status = %s)"
)


class BatchDuties:
    """Batch expiry: past its deadline a waiting batch stops waiting and is settled."""

    def __init__(self, routes: Sequence[BatchRoute], tools: Tools) -> None:
        self.tools = tools
        self.runner = BatchRunner(routes)

    def sweep(self, report: SweepReport) -> None:
        """Expire each route's overdue batches (at most ``max_overdue_per_sweep`` each)."""
        limit = self.tools.settings.max_overdue_per_sweep
        for stream in self.runner.routes:
            for share in self.runner.expire(self.tools.conn, stream, limit):
                share.outcome().count(stream)
                report["batches_expired"] += sum(share.assembled.values()) + share.inconsistent

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


def duties(routes: Sequence[BatchRoute], tools: Tools) -> BatchDuties:
    """The batch kind's duties over its routes."""
    return BatchDuties(routes, tools)
