"""The consumer's main loop: take a poll batch, apply each route's share, settle, mark it done.

Per batch: PostgreSQL (each route's apply), then ``settle`` (dead letters and held
copies, counts), then the source hears the batch is done (a consumer group commits
its offsets). When a dependency fails the batch is kept, the source paused
(``pausing``), and the batch retried with backoff; nothing is skipped and nothing is
marked done before its effect is durable.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import structlog
from confluent_kafka import Message

from consumer import metrics, tables
from consumer.kinds import KINDS, Kind, Resources, Route, apply_guarded
from consumer.loop import tracing
from consumer.loop.classic import ClassicGroup
from consumer.loop.last_delivery import letter_last
from consumer.loop.late import LateWork
from consumer.loop.outputs import create_topics, letters_producer
from consumer.loop.pausing import Pausing
from consumer.loop.poll import Routing, parts, prepare
from consumer.loop.settle import settle
from consumer.loop.share import ShareGroup
from consumer.loop.source import Source
from consumer.settings import ConsumerSettings
from schemas.runtime import kafka_watch
from schemas.runtime.health import Health
from schemas.runtime.logs import first_line
from schemas.runtime.outages import Outages, dependency, down, waited_out

log = structlog.get_logger(__name__)

# With no messages coming, how often the dependencies are checked, so that an outage
# shows in readiness and the pause gauge before the next batch runs into it.
IDLE_PROBE_INTERVAL_S = 2.0
# After waiting out an outage that stopped work in lanes: how long to watch it run again.
RETRIED_LANES_WAIT_S = 5.0


class ConsumerService:
    """One consumer process. ``run`` returns after ``stop`` once the batch in hand is done."""

    def __init__(
        self,
        settings: ConsumerSettings,
        routes: Sequence[Route],
        health: Health,
        kinds: Mapping[str, Kind] = KINDS,
        source: Source | None = None,
    ) -> None:
        self.settings = settings
        self.health = health
        # Started once: an unimportable handler is a start-up error.
        self.routing = Routing.start(routes, kinds)
        self.reading = settings.reading()
        self.resources = Resources(
            settings, "inorder-consumer", carry=True, producer=lambda: letters_producer(settings)
        )
        if settings.consumer_mode == "share":
            for applier in self.routing.appliers:
                applier.share()
        self.source = source or self._source(settings, health)
        self.late = LateWork(self.source, self.routing.appliers)
        self._migrations = tables.migration_sets(self.routing.kinds)
        self._stopping = False
        self._connected = False
        self._started = False
        self._gauges = metrics.Gauges(
            tables=[k.gauges for k in self.routing.kinds if k.gauges is not None]
        )
        self._pausing = Pausing(self.source, Outages("consumption", health, lambda: self._stopping))
        self._probe_at = 0.0

    def _source(self, settings: ConsumerSettings, health: Health) -> Source:
        """The consumer group the settings name, or a share group (``INORDER_CONSUMER_MODE``)."""
        topics = [*settings.topics, *self.reading.topics]
        if settings.consumer_mode == "share":
            return ShareGroup(
                settings,
                topics,
                health,
                letter=lambda messages: letter_last(self.resources, self.reading, messages),
            )
        return ClassicGroup(settings, topics, health)

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand, mark it done and leave."""
        self._stopping = True

    # ------------------------------------------------------------------ start and stop

    def connect(self) -> None:
        """Connect PostgreSQL, run each kind's start-up check, check every route, migrate.

        ``RoutesError`` when a route does not fit the database, a ``StartupError`` when a
        kind's check fails (Redis that can lose parks); both before any change.
        """
        self.resources.conn.execute("SELECT 1")
        self.health.cleared("postgres")
        if self._connected:
            return
        self.routing.check(self.resources)
        if self.resources.has_redis:
            self.health.cleared("redis")
        self.routing.connect(self.resources)
        tables.migrate(self.resources.conn, self._migrations)
        self._connected = True

    def _start(self) -> None:
        create_topics(self.settings, [t for a in self.routing.appliers for t in a.route.topics])
        self.resources.producer.poll(0)  # made now: a setting it refuses shows at start
        self.source.start()
        self._started = True
        self.health.cleared("starting")
        log.info(
            "consumer_started",
            topics=self.settings.topics,
            debezium_topics=self.reading.topics,
            group=self.settings.group_id,
            mode=self.settings.consumer_mode,
            protocol="share"
            if self.settings.consumer_mode == "share"
            else self.settings.group_protocol,
        )

    def _close(self) -> None:
        if self._started:
            self._finish_late()
            self.source.close()
        self.routing.close()
        self.resources.close()
        log.info("consumer_stopped")

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Consume until ``stop``."""
        try:
            while not self._stopping and not self._started:
                try:
                    self.connect()
                    self._start()
                except Exception as exc:
                    if not down(exc):
                        raise
                    self.resources.lost(dependency(exc))
                    self._pausing.outages.wait(exc)
            while not self._stopping:
                self._poll_once()
        finally:
            self._close()

    def _poll_once(self) -> None:
        settings = self.settings
        messages = self.source.take(
            settings.poll_max_messages,
            settings.poll_timeout_ms / 1000,
            settings.poll_linger_ms / 1000,
        )
        self.health.beat()
        self._gauges.refresh(self.resources.conn if self.resources.has_conn else None)
        self.source.tick()
        # A permission refused (the group's, a topic's) is noted for /readyz and logged
        # once a minute; any other error message passes by itself.
        usable = kafka_watch.usable(messages)
        if usable:
            self._handle(usable)
            self._probe_at = time.monotonic() + IDLE_PROBE_INTERVAL_S
        self._gather()
        # A pause on an outage counts as idle too (the source settled as it paused).
        self.source.settle(idle=not usable)
        if not usable and time.monotonic() >= self._probe_at:
            self._check_dependencies()

    def _handle(self, messages: list[Message]) -> None:
        started = time.perf_counter()
        metrics.CONSUMED.inc(len(messages))
        metrics.POLL_SIZE.observe(len(messages))
        # In parts whose decoded events fit the memory budget, each applied and settled
        # before the next is decoded; a batch of small events is one part.
        for part in parts(messages, self.settings.poll_max_bytes):
            if not self._handle_part(part):
                return
        self._pausing.resume()
        metrics.POLL_DURATION.observe(time.perf_counter() - started)

    def _handle_part(self, messages: list[Message]) -> bool:
        """Apply one part of a poll batch, waiting out outages; False: stopping meanwhile."""
        while messages:
            try:
                self._apply(messages)
                break
            except Exception as exc:
                if not waited_out(exc):  # an input's own error was refused by the barrier
                    raise
                self._pausing.pause()
                self._wait_out(exc)
                if self._stopping:
                    log.warning("consumer_stopping_with_unapplied_batch", messages=len(messages))
                    return False
                messages = [m for m in messages if self.source.ours(m)]
                if not messages:  # all handed back meanwhile: nothing new until it answers
                    self._check_dependencies()
        return True

    def _apply(self, messages: list[Message]) -> None:
        """Every route's share, then ``settle`` (letters, counts), then the source hears."""
        conn, producer = self.resources.conn, self.resources.producer
        prepared = prepare(messages, self.routing, self.reading)
        outcomes = []
        raw = tracing.values(prepared.raw, prepared.by_event)
        for applier, events in prepared.shares:
            group = self.settings.group_id
            with tracing.processing(applier, events, prepared.by_event, group) as span:
                outcome = apply_guarded(applier, conn, events, raw)
                tracing.counted(span, outcome)
            outcomes.append((applier, outcome))
        self.late.defer(outcomes, prepared.by_event)  # nothing passes the work carried on
        settle(conn, producer, self.settings, prepared, outcomes)
        self.source.done(prepared.messages)

    # ------------------------------------------------------------------ work past the batch

    def _gather(self) -> None:
        """Report what routes finished past its batch; an outage in it pauses, as a batch's."""
        paused = False
        while True:
            try:
                # After a wait, the work tried again gets a moment to finish or fail, so
                # that a lasting outage is waited out with a growing delay.
                outage = self.late.gather(self.resources, RETRIED_LANES_WAIT_S if paused else 0.0)
            except Exception as exc:
                if not waited_out(exc):
                    raise
                outage = exc
            if outage is None:
                break
            paused = True
            self._pausing.pause()
            self._wait_out(outage)
            if self._stopping:
                return
        if paused:
            self._pausing.resume()

    def _finish_late(self) -> None:
        """At stop: wait for the lanes, report what they did; the rest is delivered again."""
        try:
            outage = self.late.gather(self.resources, None)
        except Exception as exc:
            if not waited_out(exc):
                raise
            outage = exc
        if outage is not None or len(self.late):
            log.warning(
                "consumer_stopping_with_unfinished_lanes",
                events=len(self.late),
                error=None if outage is None else first_line(outage),
            )

    # ------------------------------------------------------------------ dependencies

    def _check_dependencies(self) -> None:
        """While idle, ping PostgreSQL and Redis; one that is down pauses like a failed batch."""
        while not self._stopping:
            try:
                self.resources.conn.execute("SELECT 1")
                if self.resources.has_redis:
                    self.resources.redis.ping()
                break
            except Exception as exc:
                if not down(exc):  # a full disk answers even PING with MISCONF
                    raise
                self._pausing.pause()
                self._wait_out(exc)
        self._pausing.resume()
        self._probe_at = time.monotonic() + IDLE_PROBE_INTERVAL_S

    def _wait_out(self, exc: BaseException) -> None:
        self.resources.lost(dependency(exc))
        self._pausing.wait(exc)
