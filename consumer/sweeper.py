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
import redis
import structlog
from confluent_kafka import Consumer, Producer
from psycopg.types.json import set_json_loads

from consumer import gaps, gauges, metrics, steps, tables
from consumer.batch_runner import BatchRunner
from consumer.lease import Lease
from consumer.outages import DOWN, dependency
from consumer.parking import ParkingLot
from consumer.routes import BatchRoute, Route, StepRoute
from consumer.settings import SweeperSettings
from consumer.step_runner import StepRunner
from consumer.steps import Progress, StepStore
from schemas import DecodeError, decode
from schemas.backoff import Backoff
from schemas.health import Health
from schemas.logs import first_line
from schemas.republish import RepublishRequest, backoff_delays, decode_result, encode

log = structlog.get_logger(__name__)
TICK_S = 0.2


@dataclass(frozen=True, slots=True)
class Links:
    """The sweeper's connections, made by ``connect``."""

    conn: psycopg.Connection[Any]
    lot: ParkingLot
    runner: StepRunner
    lease: Lease
    producer: Producer
    results: Consumer


@dataclass(slots=True)
class SweepReport:
    """What one sweep did."""

    overdue: int = 0
    escalated: int = 0
    requested: int = 0
    healed: int = 0
    batches_expired: int = 0


class Sweeper:
    """One sweeper process: active while it holds the lease, standing by otherwise."""

    def __init__(self, settings: SweeperSettings, routes: Sequence[Route], health: Health) -> None:
        self.settings = settings
        self.health = health
        self.stores = {
            r.stream: StepStore(r, steps.resolve(r)) for r in routes if isinstance(r, StepRoute)
        }
        self.delays = backoff_delays(
            settings.republish_backoff_base_s, settings.republish_backoff_max_s,
            settings.republish_max_attempts,
        )  # fmt: skip
        self.batches = BatchRunner([r for r in routes if isinstance(r, BatchRoute)])
        self._stopping = False
        self._links: Links | None = None

    @property
    def io(self) -> Links:
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
        set_json_loads(orjson.loads, conn)
        tables.create(conn)
        if self.settings.redis_url is None:
            raise ValueError("REDIS_URL is required by the sweeper")
        client = redis.Redis.from_url(
            self.settings.redis_url.get_secret_value(), socket_timeout=10, socket_connect_timeout=5
        )
        prefix = self.settings.redis_key_prefix
        lot = ParkingLot(client, prefix)
        lease = Lease(client, f"{prefix}:sweeper:lease", int(self.settings.lease_ttl_s * 1000))
        config = self.settings.kafka_config()
        results = Consumer(
            {**config, "group.id": self.settings.sweeper_group_id, "enable.auto.commit": False,
             "auto.offset.reset": "earliest", "client.id": "inorder-sweeper"}
        )  # fmt: skip
        results.subscribe([self.settings.republish_results_topic])
        producer = Producer({**config, "client.id": "inorder-sweeper", "acks": "all"})
        self._links = Links(conn, lot, StepRunner(self.stores, lot), lease, producer, results)
        self.health.cleared("starting")

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Sweep while holding the lease, stand by while another sweeper holds it.

        When PostgreSQL, Redis or Kafka goes away the sweeper stops acting, reports
        itself unready and retries with backoff; it carries on by itself once the
        service is back (a standby may have taken the lease meanwhile).
        """
        backoff = Backoff()
        due = {"sweep": 0.0, "gauges": 0.0}
        try:
            while not self._stopping:
                self.health.beat()
                try:
                    active = self._tick(due)
                except DOWN as exc:
                    self._wait_out(backoff, exc)
                    continue
                if backoff.failures:
                    backoff.succeeded()
                    for name in ("postgres", "redis", "kafka"):
                        self.health.cleared(name)
                    log.info("sweeper_resumed")
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
        now = time.monotonic()
        if active and now >= due["sweep"]:
            due["sweep"] = now + self.settings.sweep_interval_s
            self.sweep()
        if active:
            self.answers()
        if active and now >= due["gauges"]:
            due["gauges"] = now + self.settings.gauge_interval_s
            self.export_gauges()
        return active

    def _wait_out(self, backoff: Backoff, exc: BaseException) -> None:
        name, detail, delay = dependency(exc), first_line(exc), backoff.failed()
        metrics.SWEEPER_ACTIVE.set(0)
        self.health.blocked(name, detail)
        log.warning(f"{name}_unavailable", error=detail, retry_in_s=delay)
        self.health.sleep(delay, lambda: self._stopping, TICK_S)

    def _reconnect_postgres(self) -> None:
        conn = psycopg.connect(self.settings.database_url.get_secret_value(), autocommit=True)
        set_json_loads(orjson.loads, conn)
        self._links = replace(self.io, conn=conn)
        log.info("postgres_reconnected")

    def _close(self) -> None:
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
        for route in self.stores:
            self._heal(route, report)
            self._overdue(route, report)
        for stream in self.batches.routes:
            outcome = self.batches.expire(self.io.conn, stream, self.settings.max_overdue_per_sweep)
            outcome.count()
            report.batches_expired += sum(outcome.assembled.values()) + outcome.inconsistent
        self.io.producer.flush(30)
        metrics.SWEEP_DURATION.observe(time.perf_counter() - started)
        return report

    def _heal(self, route: str, report: SweepReport) -> None:
        io = self.io
        open_gaps = [g for g in gaps.unresolved(io.conn, route) if g.status != "unrecoverable"]
        progress = self.stores[route].read(io.conn, [g.entity_id for g in open_gaps])
        for gap in open_gaps:
            now = progress.get(gap.entity_id)
            if now is not None and gaps.healed(gap, now):
                gaps.resolve(io.conn, gap, "healed", "sweeper", "range applied")
                seconds = time.time() - gap.first_seen.timestamp()
                metrics.GAP_HEAL_TIME.observe(seconds)
                report.healed += 1
                log.info("gap_healed", route=route, entity=gap.entity_id, seconds=round(seconds, 3))

    def _overdue(self, route: str, report: SweepReport) -> None:
        io = self.io
        cutoff = time.time() - self.settings.gap_deadline_s
        entries = io.lot.client.zrangebyscore(
            io.lot.index_key(route), "-inf", cutoff, start=0,
            num=self.settings.max_overdue_per_sweep,
        )  # fmt: skip
        entities = [e.decode() for e in entries]  # type: ignore[union-attr]
        report.overdue += len(entities)
        if not entities:
            return
        firsts = io.lot.fetch(route, entities, 1)
        empty = [e for e in entities if e not in firsts]
        if empty:  # index entries left behind by a crash between index and park
            io.lot.unindex_empty(route, empty)
        progress = self.stores[route].read(io.conn, list(firsts))
        for entity_id, members in firsts.items():
            self._entity(route, entity_id, members[0], progress, report)

    def _entity(
        self, route: str, entity_id: str, member: bytes, progress: dict[str, Progress],
        report: SweepReport,
    ) -> None:  # fmt: skip
        io = self.io
        try:
            first = decode(member)
        except DecodeError:
            return
        current = progress.get(entity_id, Progress(first.generation, 0))
        span = gaps.missing_range(current, first)
        if span is None:  # the next seq is parked: a drain was missed, do it now
            io.runner.drain(io.conn, route, [entity_id])
            return
        if gaps.open_gap(io.conn, route, entity_id, span, first.event_type):
            report.escalated += 1
            metrics.GAPS_ESCALATED.labels(first.event_type).inc()
            log.error(
                "gap_escalated", route=route, entity=entity_id, generation=span[0],
                from_seq=span[1], to_seq=span[2], parked_from=first.seq,
            )  # fmt: skip
        gap = gaps.find(io.conn, route, entity_id)
        if gap is None or gap.status == "unrecoverable":
            return
        if (gap.generation, gap.from_seq, gap.to_seq) != span:
            io.conn.execute(
                "UPDATE inorder_gaps SET generation = %s, from_seq = %s, to_seq = %s WHERE id = %s",
                (*span, gap.id),
            )
        if gap.next_attempt_at.timestamp() <= time.time():
            self._request(route, gap, span, report)

    def _request(
        self, route: str, gap: gaps.Gap, span: tuple[int, int, int], report: SweepReport
    ) -> None:
        io = self.io
        if gap.attempts >= len(self.delays):
            self._unrecoverable(gap, f"no repair after {gap.attempts} republish requests", None)
            return
        request = RepublishRequest(
            f"gap-{gap.id}-{gap.attempts + 1}-{uuid.uuid4().hex[:6]}", route, gap.entity_id,
            span[0], span[1], span[2], f"gap open since {gap.first_seen.isoformat()}",
        )  # fmt: skip
        io.producer.produce(self.settings.republish_requests_topic, encode(request), request.key)
        gaps.requested(io.conn, gap, self.delays[gap.attempts])
        metrics.REPUBLISH_REQUESTED.inc()
        report.requested += 1
        log.info("republish_requested", route=route, entity=gap.entity_id,
                 from_seq=span[1], to_seq=span[2], attempt=gap.attempts + 1)  # fmt: skip

    def _unrecoverable(self, gap: gaps.Gap, reason: str, missing: list[int] | None) -> None:
        io = self.io
        with io.conn.transaction():
            gaps.resolve(io.conn, gap, "unrecoverable", "sweeper", reason, missing)
            self.stores[gap.route].hold(io.conn, gap.entity_id)
        log.error("gap_unrecoverable", route=gap.route, entity=gap.entity_id,
                  from_seq=gap.from_seq, to_seq=gap.to_seq, reason=reason)  # fmt: skip

    # ------------------------------------------------------------------ answers and gauges

    def answers(self) -> None:
        """Read the relay's answers: seqs it no longer has make their gap unrecoverable."""
        io = self.io
        for message in io.results.consume(num_messages=100, timeout=0):
            if message.error() is not None:
                continue
            try:
                result = decode_result(message.value())
            except DecodeError:
                log.warning("republish_result_unreadable", offset=message.offset())
            else:
                gap = gaps.find(io.conn, result.entity_type, result.entity_id)
                lost = sorted(set(result.missing) | set(result.failed))
                if (
                    gap is not None
                    and gap.status != "unrecoverable"
                    and any(gap.from_seq <= s <= gap.to_seq for s in lost)
                ):
                    self._unrecoverable(gap, "the outbox no longer has these seqs", lost)
            io.results.commit(message=message, asynchronous=False)

    def export_gauges(self) -> None:
        """Parked events now, the oldest park's age, gaps by status, batches waiting or held."""
        io = self.io
        gauges.export_parked(io.lot, list(self.stores))
        gauges.export_gaps(io.conn)
        if self.batches.routes:
            gauges.export_batches(io.conn)
