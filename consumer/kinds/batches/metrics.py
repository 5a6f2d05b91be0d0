"""The batch kind's Prometheus metrics (results, assemblies, pending and held) and its tally."""

from __future__ import annotations

from collections import Counter as Counts
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from consumer.kinds._outcome import Tally

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


@dataclass(slots=True)
class BatchTally(Tally):
    """What a batch route's share did: results by verdict, assemblies, inconsistent batches."""

    results: Counts[str] = field(default_factory=Counts)
    assembled: Counts[str] = field(default_factory=Counts)
    inconsistent: int = 0

    def count(self, stream: str) -> None:
        """Worker results by verdict, assemblies by outcome, and inconsistent batches."""
        for verdict, n in self.results.items():
            BATCH_RESULTS.labels(verdict).inc(n)
        for assembled, n in self.assembled.items():
            BATCHES_ASSEMBLED.labels(assembled).inc(n)
        if self.inconsistent:
            BATCHES_INCONSISTENT.inc(self.inconsistent)
