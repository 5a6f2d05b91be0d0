"""The sweeper: the lease, the tick loop, and each route kind's periodic duties.

One sweeper is active at a time (a Redis lease); others wait. The active one runs
every kind's ``Duties`` each sweep interval (step routes repair gaps, batch routes
expire batches), hands each republish result to the kind of its stream, and exports
the kinds' gauges.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import Consumer, Message

from consumer import metrics, tables
from consumer.kinds import KINDS, Answered, Duties, Kind, Resources, Route, SweepReport
from consumer.settings import SweeperSettings
from consumer.sweeper import history
from consumer.sweeper.lease import Lease
from schemas import tracing
from schemas.limits import safe_text
from schemas.republish import decode_result
from schemas.runtime import kafka_clients, kafka_watch
from schemas.runtime.health import Health
from schemas.runtime.outages import Outages, dependency, down, waited_out
from schemas.runtime.redelivery import handle_each

log = structlog.get_logger(__name__)
TICK_S = 0.2


@dataclass(frozen=True, slots=True)
class Membership:
    """What the sweeper holds of its own: the lease, and its reader of the relay's answers."""

    lease: Lease
    results: Consumer


class Sweeper:
    """One sweeper process: active while it holds the lease, standing by otherwise."""

    def __init__(
        self,
        settings: SweeperSettings,
        routes: Sequence[Route],
        health: Health,
        kinds: Mapping[str, Kind] = KINDS,
    ) -> None:
        self.settings = settings
        self.health = health
        self.routes = list(routes)
        self.kinds = kinds
        self._migrations = tables.migration_sets([kinds[r.kind] for r in routes])
        # What the kinds' duties use: the consumer's database, Redis, a producer.
        self.resources = Resources(settings, "inorder-sweeper")
        # Each kind's duties, started at connect; and which kind's routes take a stream.
        self.duties: dict[str, Duties] = {}
        self._kind_of = {s: r.kind for r in routes for s in r.streams}
        self._stopping = False
        self._reading_results = False
        self._own: Membership | None = None
        self._outages = Outages("sweeper", health, lambda: self._stopping)

    @property
    def own(self) -> Membership:
        """The lease and the results reader; ``connect`` first."""
        if self._own is None:
            raise RuntimeError("Sweeper.connect() has not run")
        return self._own

    def stop(self) -> None:
        """Finish the sweep in hand and give the lease up."""
        self._stopping = True

    def connect(self) -> None:
        """Connect PostgreSQL, Redis and Kafka, and create the tables the sweeper writes."""
        tables.migrate(self.resources.conn, self._migrations)
        # Without REDIS_URL, ``resources.redis`` names it (``NotConfiguredError``).
        prefix = self.settings.redis_key_prefix
        lease = Lease(
            self.resources.redis, f"{prefix}:sweeper:lease", int(self.settings.lease_ttl_s * 1000)
        )
        results = kafka_clients.consumer(
            self.settings, "inorder-sweeper", self.settings.sweeper_group_id
        )
        self.resources.producer.poll(0)  # made now: a setting it refuses shows at start
        self._own = Membership(lease, results)
        for name, kind in self.kinds.items():
            routes = [r for r in self.routes if r.kind == name]
            if routes and kind.duties is not None:
                self.duties[name] = kind.duties(routes, self.resources)
        self.health.cleared("starting")

    def close(self) -> None:
        """Close what ``connect`` opened (``run`` does it on the way out)."""
        self._close()

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Sweep while holding the lease, stand by while another sweeper holds it.

        When PostgreSQL, Redis or Kafka goes away the sweeper stops acting, reports
        itself unready and retries with backoff; it carries on by itself once the
        service is back (a standby may have taken the lease meanwhile).
        """
        due = {"sweep": 0.0, "gauges": 0.0}
        try:
            while not self._stopping and self._own is None:
                try:  # a dependency down at start-up is waited out like any other outage
                    self.connect()
                except Exception as exc:
                    if not down(exc):
                        raise
                    self.resources.lost(dependency(exc))
                    self._outages.wait(exc)
            if self._own is not None:
                log.info("sweeper_started", holder=self.own.lease.holder)
            while not self._stopping:
                self.health.beat()
                try:
                    active = self._tick(due)
                except Exception as exc:
                    if not waited_out(exc):
                        raise
                    metrics.SWEEPER_ACTIVE.set(0)
                    self.resources.lost(dependency(exc))
                    self._outages.wait(exc)
                    continue
                self._outages.recovered()
                time.sleep(TICK_S if active else min(1.0, self.settings.lease_ttl_s / 3))
        finally:
            self._close()

    def _tick(self, due: dict[str, float]) -> bool:
        """One turn of the loop; whether this sweeper holds the lease."""
        active = self.own.lease.keep()
        metrics.SWEEPER_ACTIVE.set(1 if active else 0)
        self._read_results(active=active)
        now = time.monotonic()
        # Answers first: a gap whose range came back heals with its answer on record.
        changed = active and self.answers()
        if active and now >= due["sweep"]:
            due["sweep"] = now + self.settings.sweep_interval_s
            changed = self.sweep().changed or changed
        if changed:  # gaps moved: their gauges follow now, not at the next interval
            for duty in self.duties.values():
                duty.gauges(every=False)
        if active and now >= due["gauges"]:
            due["gauges"] = now + self.settings.gauge_interval_s
            self.export_gauges()
        if active and now >= due.get("history", 0.0):
            due["history"] = now + self.settings.history_interval_s
            self.forget_history()
        return active

    def forget_history(self) -> None:
        """Delete a slice of the history past its retention (none when it is 0)."""
        retention_s = self.settings.history_retention_s
        if not retention_s:
            return
        gone = history.forget(self.resources.conn, retention_s, self.settings.history_batch_rows)
        for table, rows in gone.items():
            if rows:
                metrics.HISTORY_DELETED.labels(table).inc(rows)
        if any(gone.values()):
            log.info("history_forgotten", **{t: n for t, n in gone.items() if n})

    def _read_results(self, *, active: bool) -> None:
        """Join the results' group while active, leave it when standing by.

        A standby in the group would hold partitions it never reads, until Kafka drops
        it for not polling minutes later, and their results would wait that long.
        """
        if active and not self._reading_results:
            self.own.results.subscribe([self.settings.republish_results_topic])
        elif not active and self._reading_results:
            self.own.results.unsubscribe()
        self._reading_results = active

    def _close(self) -> None:
        own, self._own = self._own, None
        if own is None:
            return
        metrics.SWEEPER_ACTIVE.set(0)
        try:  # a standby takes a lease not given back once it lapses
            own.lease.release()
        except Exception as exc:
            if not down(exc):
                raise
        own.results.close()
        for duty in self.duties.values():  # a kind's own connections
            duty.close()
        self.resources.close()

    # ------------------------------------------------------------------ sweeping

    def sweep(self) -> SweepReport:
        """One pass of every kind's duties; the requests they made are flushed."""
        started = time.perf_counter()
        report = SweepReport()
        for duty in self.duties.values():
            duty.sweep(report)
        self.resources.producer.flush(30)
        metrics.SWEEP_DURATION.observe(time.perf_counter() - started)
        return report

    # ------------------------------------------------------------------ answers and gauges

    def answers(self) -> bool:
        """Read the relay's answers and hand each to the kind whose route takes its stream.

        Returns whether any gap changed. A result that cannot be used is counted invalid
        and committed; only an outage leaves it to be read again.
        """
        changed = False

        def use(message: Message) -> None:
            nonlocal changed
            answered = self._answer(message.value(), message.headers())
            changed = answered is Answered.CHANGED or changed
            if answered is Answered.UNMATCHED:
                self._unmatched(message)
            else:
                metrics.REPUBLISH_RESULTS.labels("used").inc()

        # A refused permission among the errors shows on /readyz.
        good = kafka_watch.usable(self.own.results.consume(num_messages=100, timeout=0))
        handle_each(self.own.results, good, use, self._invalid_result, "unusable")
        return changed

    def _answer(self, raw: bytes | None, headers: Any = None) -> Answered:
        """Act on one result; what came of it (unmatched for a stream no kind asks for)."""
        result = decode_result(raw)
        duty = self.duties.get(self._kind_of.get(result.entity_type, ""))
        if duty is None:
            return Answered.UNMATCHED
        with tracing.continuing(tracing.creation_context(headers)):
            return duty.answer(result)

    @staticmethod
    def _unmatched(message: Message) -> None:
        """Count and log a result that answers no open request; it changes nothing."""
        metrics.REPUBLISH_RESULTS.labels("unmatched").inc()
        log.warning(
            "republish_result_unmatched",
            partition=message.partition(),
            offset=message.offset(),
            detail="answers no open request of this generation: ignored",
        )

    @staticmethod
    def _invalid_result(message: Message, reason: str, detail: str) -> None:
        """Count and log a result that cannot be used; it is never retried."""
        metrics.REPUBLISH_RESULTS.labels("invalid").inc()
        log.warning(
            "republish_result_invalid",
            reason=reason,
            detail=safe_text(detail)[:300],
            offset=message.offset(),
        )

    def export_gauges(self) -> None:
        """Every kind's gauges (parked events, gaps by status, batches waiting or held)."""
        for duty in self.duties.values():
            duty.gauges(every=True)
