"""The sweeper: gaps that outlive their deadline are recorded, escalated and repaired.

One sweeper is active at a time (a Redis lease); others wait. Each sweep reads only
the overdue part of each route's park index, so its cost follows the number of
overdue gaps, not of parked entities.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

import orjson
import psycopg
import structlog
from confluent_kafka import Consumer, Message, Producer
from psycopg.types.json import set_json_loads

from consumer import metrics, tables
from consumer.kinds import KINDS, Links
from consumer.kinds.batches.runner import BatchRunner
from consumer.kinds.steps import StepApplier
from consumer.kinds.steps.parking import ParkingLot
from consumer.kinds.steps.plan import Progress
from consumer.routes import Route, by_kind
from consumer.settings import SweeperSettings
from consumer.sweeper import gaps, gauges
from consumer.sweeper.gaps import GapStatus
from consumer.sweeper.lease import Lease
from schemas import DecodeError, decode
from schemas.limits import safe_text
from schemas.republish import RepublishRequest, backoff_delays, decode_result, encode
from schemas.runtime import kafka_clients
from schemas.runtime.health import Health
from schemas.runtime.outages import DOWN, Outages, waited_out
from schemas.runtime.redelivery import handle_each
from schemas.runtime.redis_client import connect as connect_redis

log = structlog.get_logger(__name__)
TICK_S = 0.2
# The event type recorded for a gap found by its lost parks (no parked event to name it).
LOST_PARK = "lost_park"


@dataclass(frozen=True, slots=True)
class Connections:
    """The sweeper's connections, made by ``connect``."""

    conn: psycopg.Connection[Any]
    lot: ParkingLot
    lease: Lease
    producer: Producer
    results: Consumer


@dataclass(slots=True)
class SweepReport:
    """What one sweep did."""

    overdue: int = 0
    parks_lost: int = 0
    escalated: int = 0
    requested: int = 0
    healed: int = 0
    unrecoverable: int = 0
    batches_expired: int = 0


class Sweeper:
    """One sweeper process: active while it holds the lease, standing by otherwise."""

    def __init__(self, settings: SweeperSettings, routes: Sequence[Route], health: Health) -> None:
        self.settings = settings
        self.health = health
        # Each step route started as the consumer starts it, to drain what became due.
        self.steps = {r.stream: StepApplier(r) for r in by_kind(routes, "step")}
        self.delays = backoff_delays(
            settings.republish_backoff_base_s,
            settings.republish_backoff_max_s,
            settings.republish_max_attempts,
        )
        self.batches = BatchRunner(by_kind(routes, "batch"))
        self._migrations = tables.migration_sets([KINDS[r.kind] for r in routes])
        self._stopping = False
        self._reading_results = False
        self._links: Connections | None = None
        self._outages = Outages("sweeper", health, lambda: self._stopping)

    @property
    def io(self) -> Connections:
        """The connections; ``connect`` first."""
        if self._links is None:
            raise RuntimeError("Sweeper.connect() has not run")
        return self._links

    def stop(self) -> None:
        """Finish the sweep in hand and give the lease up."""
        self._stopping = True

    def connect(self) -> None:
        """Connect PostgreSQL, Redis and Kafka, and create the tables the sweeper writes."""
        conn = psycopg.connect(self.settings.database_url.get_secret_value(), autocommit=True)
        try:
            set_json_loads(orjson.loads, conn)
            tables.migrate(conn, self._migrations)
        except BaseException:
            conn.close()
            raise
        if self.settings.redis_url is None:
            raise ValueError("REDIS_URL is required by the sweeper")
        client = connect_redis(
            self.settings.redis_url.get_secret_value(), socket_timeout=10, socket_connect_timeout=5
        )
        prefix = self.settings.redis_key_prefix
        lot = ParkingLot(client, prefix, self.settings.park_buckets)
        lease = Lease(client, f"{prefix}:sweeper:lease", int(self.settings.lease_ttl_s * 1000))
        results = kafka_clients.consumer(
            self.settings, "inorder-sweeper", self.settings.sweeper_group_id
        )
        producer = kafka_clients.producer(self.settings, "inorder-sweeper")
        for applier in self.steps.values():
            applier.connect(Links(conn, client, prefix, self.settings.park_buckets))
        self._links = Connections(conn, lot, lease, producer, results)
        self.health.cleared("starting")

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Sweep while holding the lease, stand by while another sweeper holds it.

        When PostgreSQL, Redis or Kafka goes away the sweeper stops acting, reports
        itself unready and retries with backoff; it carries on by itself once the
        service is back (a standby may have taken the lease meanwhile).
        """
        due = {"sweep": 0.0, "gauges": 0.0}
        try:
            while not self._stopping and self._links is None:
                try:  # a dependency down at start-up is waited out like any other outage
                    self.connect()
                except DOWN as exc:
                    self._outages.wait(exc)
            if self._links is not None:
                log.info("sweeper_started", holder=self.io.lease.holder)
            while not self._stopping:
                self.health.beat()
                try:
                    active = self._tick(due)
                except Exception as exc:
                    if not waited_out(exc):
                        raise
                    metrics.SWEEPER_ACTIVE.set(0)
                    self._outages.wait(exc)
                    continue
                self._outages.recovered()
                time.sleep(TICK_S if active else min(1.0, self.settings.lease_ttl_s / 3))
        finally:
            self._close()

    def _tick(self, due: dict[str, float]) -> bool:
        """One turn of the loop; whether this sweeper holds the lease."""
        if self.io.conn.closed:
            self._reconnect_postgres()
        io = self.io
        active = io.lease.keep()
        metrics.SWEEPER_ACTIVE.set(1 if active else 0)
        self._read_results(active=active)
        now = time.monotonic()
        changed = False
        if active and now >= due["sweep"]:
            due["sweep"] = now + self.settings.sweep_interval_s
            report = self.sweep()
            changed = bool(report.escalated or report.requested or report.healed)
            changed = changed or bool(report.unrecoverable)
        if active:
            changed = self.answers() or changed
        if changed:  # gaps moved: their gauge follows now, not at the next interval
            gauges.export_gaps(io.conn)
        if active and now >= due["gauges"]:
            due["gauges"] = now + self.settings.gauge_interval_s
            self.export_gauges()
        return active

    def _read_results(self, *, active: bool) -> None:
        """Join the results' group while active, leave it when standing by.

        A standby in the group would hold partitions it never reads, until Kafka drops
        it for not polling minutes later, and their results would wait that long.
        """
        if active and not self._reading_results:
            self.io.results.subscribe([self.settings.republish_results_topic])
        elif not active and self._reading_results:
            self.io.results.unsubscribe()
        self._reading_results = active

    def _reconnect_postgres(self) -> None:
        conn = psycopg.connect(self.settings.database_url.get_secret_value(), autocommit=True)
        set_json_loads(orjson.loads, conn)
        self._links = replace(self.io, conn=conn)
        log.info("postgres_reconnected")

    def _close(self) -> None:
        if self._links is None:
            return
        io = self.io
        metrics.SWEEPER_ACTIVE.set(0)
        with suppress(*DOWN):
            io.lease.release()
        io.results.close()
        io.producer.flush(10)
        io.conn.close()
        io.lot.client.close()

    # ------------------------------------------------------------------ sweeping

    def sweep(self) -> SweepReport:
        """One pass over every step route: heal, detect, escalate, request."""
        started = time.perf_counter()
        report = SweepReport()
        for route in self.steps:
            # Parks an older consumer wrote during a rolling upgrade.
            self.io.lot.adopt_legacy(route)
            self._heal(route, report)
            self._overdue(route, report)
            self._parks_lost(route, report)
        for stream in self.batches.routes:
            outcome = self.batches.expire(self.io.conn, stream, self.settings.max_overdue_per_sweep)
            outcome.count()
            report.batches_expired += sum(outcome.assembled.values()) + outcome.inconsistent
        self.io.producer.flush(30)
        metrics.SWEEP_DURATION.observe(time.perf_counter() - started)
        return report

    def _heal(self, route: str, report: SweepReport) -> None:
        io = self.io
        open_gaps = [
            g for g in gaps.unresolved(io.conn, route) if g.status != GapStatus.UNRECOVERABLE
        ]
        progress = self.steps[route].store.read(io.conn, [g.entity_id for g in open_gaps])
        for gap in open_gaps:
            now = progress.get(gap.entity_id)
            if now is not None and gaps.healed(gap, now):
                gaps.resolve(io.conn, gap, GapStatus.HEALED, "sweeper", "range applied")
                seconds = time.time() - gap.first_seen.timestamp()
                metrics.GAP_HEAL_TIME.observe(seconds)
                report.healed += 1
                log.info("gap_healed", route=route, entity=gap.entity_id, seconds=round(seconds, 3))

    def _overdue(self, route: str, report: SweepReport) -> None:
        io = self.io
        cutoff = time.time() - self.settings.gap_deadline_s
        entities = io.lot.parked_before(route, cutoff, self.settings.max_overdue_per_sweep)
        report.overdue += len(entities)
        if not entities:
            return
        firsts = io.lot.fetch(route, entities, 1)
        empty = [e for e in entities if e not in firsts]
        if empty:  # index entries left behind by a crash between index and park
            io.lot.unindex_empty(route, empty)
        progress = self.steps[route].store.read(io.conn, list(firsts))
        for entity_id, members in firsts.items():
            self._entity(route, entity_id, members[0], progress, report)

    def _entity(
        self,
        route: str,
        entity_id: str,
        member: bytes,
        progress: dict[str, Progress],
        report: SweepReport,
    ) -> None:
        io = self.io
        try:
            first = decode(member)
        except DecodeError:
            return
        current = progress.get(entity_id, Progress(first.generation, 0))
        span = gaps.missing_range(current, first)
        if span is None:  # the next seq is parked: a drain was missed, do it now
            self.steps[route].drain(io.conn, [entity_id]).count(route)
            return
        self._escalate(route, entity_id, span, first.event_type, report, parked_from=first.seq)

    def _parks_lost(self, route: str, report: SweepReport) -> None:
        """Entities whose parks are ahead of progress, quiet past the deadline, nothing parked.

        Their parks were lost (a Redis crash dropped its last writes): the missing range
        runs to the newest version they parked, and is asked of the relay like any gap.
        """
        io = self.io
        store = self.steps[route].store
        ahead = store.parked_ahead(
            io.conn, self.settings.gap_deadline_s, self.settings.max_overdue_per_sweep
        )
        if not ahead:
            return
        parked = set(io.lot.indexed(route, [entity for entity, _, _ in ahead]))
        for entity_id, current, (generation, through) in ahead:
            if entity_id in parked:
                continue  # still parked: the overdue path above handles it
            start = current.last_applied + 1 if generation == current.generation else 1
            report.parks_lost += 1
            self._escalate(route, entity_id, (generation, start, through), LOST_PARK, report)

    def _escalate(
        self,
        route: str,
        entity_id: str,
        span: tuple[int, int, int],
        event_type: str,
        report: SweepReport,
        **detail: int,
    ) -> None:
        """Record the gap (once), keep its range current, and ask the relay when due."""
        io = self.io
        if gaps.open_gap(io.conn, route, entity_id, span, event_type):
            report.escalated += 1
            metrics.GAPS_ESCALATED.labels(event_type).inc()
            log.error(
                "gap_escalated",
                route=route,
                entity=entity_id,
                generation=span[0],
                from_seq=span[1],
                to_seq=span[2],
                **detail,
            )
        gap = gaps.find(io.conn, route, entity_id)
        if gap is None or gap.status == GapStatus.UNRECOVERABLE:
            return
        if (gap.generation, gap.from_seq, gap.to_seq) != span:
            gaps.move(io.conn, gap, span)
        if gap.next_attempt_at.timestamp() <= time.time():
            self._request(route, gap, span, report)

    def _request(
        self, route: str, gap: gaps.Gap, span: tuple[int, int, int], report: SweepReport
    ) -> None:
        io = self.io
        if gap.attempts >= len(self.delays):
            self._unrecoverable(gap, f"no repair after {gap.attempts} republish requests", None)
            report.unrecoverable += 1
            return
        request = RepublishRequest(
            f"gap-{gap.id}-{gap.attempts + 1}-{uuid.uuid4().hex[:6]}",
            route,
            gap.entity_id,
            span[0],
            span[1],
            span[2],
            f"gap open since {gap.first_seen.isoformat()}",
        )
        io.producer.produce(self.settings.republish_requests_topic, encode(request), request.key)
        gaps.requested(io.conn, gap, self.delays[gap.attempts])
        metrics.REPUBLISH_REQUESTED.inc()
        report.requested += 1
        log.info(
            "republish_requested",
            route=route,
            entity=gap.entity_id,
            from_seq=span[1],
            to_seq=span[2],
            attempt=gap.attempts + 1,
        )

    def _unrecoverable(self, gap: gaps.Gap, reason: str, missing: list[int] | None) -> None:
        io = self.io
        with io.conn.transaction():
            gaps.resolve(io.conn, gap, GapStatus.UNRECOVERABLE, "sweeper", reason, missing)
            self.steps[gap.route].store.hold(io.conn, gap.entity_id)
        log.error(
            "gap_unrecoverable",
            route=gap.route,
            entity=gap.entity_id,
            from_seq=gap.from_seq,
            to_seq=gap.to_seq,
            reason=reason,
        )

    # ------------------------------------------------------------------ answers and gauges

    def answers(self) -> bool:
        """Read the relay's answers: seqs it no longer has make their gap unrecoverable.

        Returns whether any gap changed. A result that cannot be used is counted invalid
        and committed; only an outage leaves it to be read again.
        """
        changed = False

        def use(message: Message) -> None:
            nonlocal changed
            changed = self._answer(message.value()) or changed
            metrics.REPUBLISH_RESULTS.labels("used").inc()

        fetched = self.io.results.consume(num_messages=100, timeout=0)
        good = [m for m in fetched if m.error() is None]
        handle_each(self.io.results, good, use, self._invalid_result, "unusable")
        return changed

    def _answer(self, raw: bytes | None) -> bool:
        """Act on one result; whether its gap changed."""
        result = decode_result(raw)
        gap = gaps.find(self.io.conn, result.entity_type, result.entity_id)
        lost = sorted(set(result.missing) | set(result.failed))
        if (
            gap is None
            or gap.status == GapStatus.UNRECOVERABLE
            or not any(gap.from_seq <= s <= gap.to_seq for s in lost)
        ):
            return False
        self._unrecoverable(gap, "the outbox no longer has these seqs", lost)
        return True

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
        """Parked events now, the oldest park's age, gaps by status, batches waiting or held."""
        io = self.io
        gauges.export_parked(io.lot, list(self.steps))
        gauges.export_gaps(io.conn)
        if self.batches.routes:
            gauges.export_batches(io.conn)
