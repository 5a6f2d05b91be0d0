"""The consumer's main loop: poll a batch, apply each route's share, settle, commit.

Commit order per batch: PostgreSQL (each route's apply), then ``settle`` (dead letters
and held copies, counts, the offsets now done), then the Kafka offsets. When a
dependency fails the batch is kept, the assignment paused (``pausing``), and the batch
retried with backoff; nothing is skipped and no offset passes unapplied work.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import structlog
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from consumer import metrics, tables
from consumer.errors import DependencyDownError, StoreNotDurableError
from consumer.kinds import (
    KINDS,
    Applier,
    Arrivals,
    Carried,
    Kind,
    Links,
    Need,
    Outcome,
    Route,
    apply_guarded,
)
from consumer.loop import tracing
from consumer.loop.offsets import Offsets, commit
from consumer.loop.pausing import Pausing
from consumer.loop.poll import Routing, parts, prepare, take
from consumer.loop.settle import report, settle
from consumer.settings import ConsumerSettings
from schemas.runtime import kafka_clients, kafka_watch, postgres
from schemas.runtime.health import Health
from schemas.runtime.logs import first_line
from schemas.runtime.outages import Outages, dependency, down, waited_out
from schemas.runtime.redis_client import RedisClient, durability_problem
from schemas.runtime.redis_client import connect as connect_redis
from schemas.topics import ensure_topics

log = structlog.get_logger(__name__)

# With no messages coming, how often the dependencies are checked, so that an outage
# shows in readiness and the pause gauge before the next batch runs into it.
IDLE_PROBE_INTERVAL_S = 2.0
# After waiting out an outage that stopped work in lanes: how long to watch it run again.
RETRIED_LANES_WAIT_S = 5.0


class ConsumerService:
    """One consumer process. ``run`` returns after ``stop`` once the batch in hand is committed."""

    def __init__(
        self,
        settings: ConsumerSettings,
        routes: Sequence[Route],
        health: Health,
        kinds: Mapping[str, Kind] = KINDS,
    ) -> None:
        self.settings = settings
        self.health = health
        # Started once: an unimportable handler is a start-up error.
        self.routing = Routing.start(routes, kinds)
        self.reading = settings.reading()
        self._needs = frozenset(n for k in self.routing.kinds for n in k.needs)
        self._migrations = tables.migration_sets(self.routing.kinds)
        self._stopping = False
        self._conn: psycopg.Connection[Any] | None = None
        self._redis: RedisClient | None = None
        self._routes_connected = False
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._offsets = Offsets()
        # The message of each event routes carried past its batch.
        self._waiting: Arrivals[Message] = Arrivals()
        # Carried work finished and not yet reported (kept through an outage).
        self._finished: list[tuple[Applier, Outcome]] = []
        self._gauges = metrics.Gauges(
            tables=[k.gauges for k in self.routing.kinds if k.gauges is not None]
        )
        self._pausing = Pausing(
            self._offsets, Outages("consumption", health, lambda: self._stopping)
        )
        self._probe_at = 0.0
        self._next_commit = 0.0

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand, commit and leave the group."""
        self._stopping = True

    # ------------------------------------------------------------------ start and stop

    def connect(self) -> None:
        """Connect PostgreSQL and Redis, check every route, then migrate the consumer's tables.

        ``RoutesError`` when a route does not fit the database, ``StoreNotDurableError``
        when step routes would park in a Redis that can lose data; both before any change.
        """
        if self._conn is None:
            self._connect_postgres()
        self._connect_redis()
        if not self._routes_connected and self._conn is not None:
            self.routing.connect(Links(self._conn, self.settings, self._redis, carry=True))
            tables.migrate(self._conn, self._migrations)
            self._routes_connected = True
            if Need.RELAY in self._needs:
                _say_if_no_relay(self._conn)

    def _connect_postgres(self) -> None:
        self._conn = postgres.connect(self.settings.database_url, "inorder-consumer")
        self.health.cleared("postgres")

    def _connect_redis(self) -> None:
        """Connect the parking store when a route parks, refusing one that can lose data."""
        if Need.REDIS not in self._needs or self._redis is not None:
            return
        if self.settings.redis_url is None:
            return  # the routes that park say so when they are connected
        client = connect_redis(
            self.settings.redis_url.get_secret_value(),
            socket_timeout=10,
            socket_connect_timeout=5,
            health_check_interval=30,
        )
        client.ping()
        problem = durability_problem(client, self.settings.park_fsync)
        if problem is not None and not self.settings.park_store_trusted:
            client.close()
            raise StoreNotDurableError(problem)
        self._redis = client
        self.health.cleared("redis")

    def _start_kafka(self) -> None:
        config = self.settings.kafka_config()
        if self.settings.create_topics:
            route_topics = [t for a in self.routing.appliers for t in a.route.topics]
            topics = [self.settings.dead_letter_topic, self.settings.held_topic, *route_topics]
            ensure_topics(
                config,
                [*self.settings.topics, *self.settings.debezium_topics, *topics],
                self.settings.topic_partitions,
                factor=self.settings.topic_replication_factor,
                min_insync=self.settings.topic_min_insync_replicas,
            )
        dlq_max = self.settings.dead_letter_max_value_bytes + 262_144  # room for key and headers
        self._producer = kafka_clients.producer(
            self.settings,
            "inorder-consumer-dlq",
            fixed={
                "message.max.bytes": dlq_max,
                # Dead letters are flushed right after each batch, and a flush sends at once
                # whatever linger.ms says; lingering would only delay the offset commit.
                "linger.ms": 0,
            },
        )
        self._consumer = kafka_clients.consumer(
            self.settings,
            "inorder-consumer",
            self.settings.group_id,
            tunables={
                # The broker answers a fetch as soon as one byte is there (fetch.min.bytes),
                # so these do not delay an event; they are set for what they do bound.
                "fetch.min.bytes": 1,
                # How long an empty fetch is held by the broker. A partition assigned or
                # resumed meanwhile joins the next fetch, so this bounds its first delay.
                "fetch.wait.max.ms": 100,
                # queued.min.messages stays at librdkafka's default (100,000 per partition):
                # above it, the next fetch waits fetch.queue.backoff.ms (1 s), which starved
                # the consumer of full batches (a quarter of the rate) when it was set lower.
            },
            fixed={
                "partition.assignment.strategy": "cooperative-sticky",
                "on_commit": self._offsets.failed,
            },
        )
        self._pausing.consumer = self._consumer
        self._consumer.subscribe(
            [*self.settings.topics, *self.reading.topics],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self.health.cleared("starting")
        log.info(
            "consumer_started",
            topics=self.settings.topics,
            debezium_topics=self.reading.topics,
            group=self.settings.group_id,
        )

    def _close(self) -> None:
        if self._consumer is not None and self._conn is not None and self._producer is not None:
            self._finish_carried()
        if self._consumer is not None:
            commit(self._consumer, self._offsets.pending(), wait=True)
            self._consumer.close()  # leaves the group
        if self._producer is not None:
            self._producer.flush(10)
        self.routing.close()
        if self._conn is not None:
            self._conn.close()
        if self._redis is not None:
            self._redis.close()
        log.info("consumer_stopped")

    # ------------------------------------------------------------------ rebalances

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("partitions_assigned", partitions=[f"{p.topic}:{p.partition}" for p in partitions])
        self._offsets.assigned(partitions)
        consumer.incremental_assign(partitions)
        self._pausing.assigned(consumer, partitions)  # a batch waiting on an outage: they wait
        self._ready_if_assigned()

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # What is done is committed now; a batch still waiting on a dependency drops these
        # partitions' messages, and their new owner reads them from the committed offset.
        log.info("partitions_revoked", partitions=[f"{p.topic}:{p.partition}" for p in partitions])
        commit(self._kafka_consumer, self._offsets.pending(partitions), wait=True)
        self._forget(partitions)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another member may own these already: commit nothing for them.
        log.warning("partitions_lost", partitions=[f"{p.topic}:{p.partition}" for p in partitions])
        self._forget(partitions)

    def _forget(self, partitions: list[TopicPartition]) -> None:
        self._offsets.forget(partitions)
        self._gauges.drop(partitions)
        self._ready_if_assigned()

    def _ready_if_assigned(self) -> None:
        if self._consumer is not None and self._consumer.assignment():
            self.health.cleared("assignment")
        else:
            self.health.blocked("assignment", "no partitions assigned")

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Consume until ``stop``."""
        try:
            while not self._stopping and self._consumer is None:
                try:
                    self.connect()
                    self._start_kafka()
                except Exception as exc:
                    if not down(exc):
                        raise
                    self._pausing.outages.wait(exc)
            while not self._stopping:
                self._poll_once()
        finally:
            self._close()

    @property
    def _kafka_consumer(self) -> Consumer:
        if self._consumer is None:
            raise KafkaException("Kafka consumer not started")
        return self._consumer

    def _poll_once(self) -> None:
        messages = take(
            self._kafka_consumer,
            self.settings.poll_max_messages,
            self.settings.poll_timeout_ms / 1000,
            self.settings.poll_linger_ms / 1000,
        )
        self.health.beat()
        self._gauges.refresh(self._consumer, self._conn)
        commit(self._kafka_consumer, self._offsets.take_retries(), wait=False)
        # A permission refused (the group's, a topic's) is noted for /readyz and logged
        # once a minute; any other error message passes by itself.
        usable = kafka_watch.usable(messages)
        if usable:
            self._handle(usable)
            self._probe_at = time.monotonic() + IDLE_PROBE_INTERVAL_S
        self._gather()
        self._commit_offsets(idle=not usable)
        if not usable and time.monotonic() >= self._probe_at:
            self._check_dependencies()

    def _commit_offsets(self, *, idle: bool) -> None:
        """Hand the done offsets to Kafka, at most every commit interval or once idle.

        A pause on an outage counts as idle too (see ``Pausing.pause``).

        Every commit is a write to the group's offsets topic; under a steady stream one
        per batch was most of the broker's requests. The effects are committed already,
        so the offsets may go asynchronously and a little later: a commit lost in a crash
        only means a redelivery, which is harmless. Stop and revoke commit synchronously.
        """
        now = time.monotonic()
        if not idle and now < self._next_commit:
            return
        offsets = self._offsets.take_unsent()
        if offsets:
            commit(self._kafka_consumer, offsets, wait=False)
            self._next_commit = now + self.settings.commit_interval_ms / 1000

    def _handle(self, messages: list[Message]) -> None:
        started = time.perf_counter()
        metrics.CONSUMED.inc(len(messages))
        metrics.BATCH_SIZE.observe(len(messages))
        # In parts whose decoded events fit the memory budget, each applied and settled
        # before the next is decoded; a batch of small events is one part.
        for part in parts(messages, self.settings.poll_max_bytes):
            if not self._handle_part(part):
                return
        self._pausing.resume()
        metrics.BATCH_DURATION.observe(time.perf_counter() - started)

    def _handle_part(self, messages: list[Message]) -> bool:
        """Apply one part of a poll batch, waiting out outages; False: stopping meanwhile."""
        while messages:
            try:
                self._commit_batch(messages)
                break
            except Exception as exc:
                if not waited_out(exc):  # an input's own error was refused by the barrier
                    raise
                self._pausing.pause()
                self._wait_out(exc)
                if self._stopping:
                    log.warning("consumer_stopping_with_unapplied_batch", messages=len(messages))
                    return False
                messages = [m for m in messages if self._offsets.ours(m)]
        return True

    def _commit_batch(self, messages: list[Message]) -> None:
        """Every route's share, then ``settle`` (letters, counts), then the offsets are done."""
        if self._conn is None:
            self._connect_postgres()
        if self._conn is None or self._producer is None:
            raise DependencyDownError("not connected")
        prepared = prepare(messages, self.routing, self.reading)
        outcomes = []
        raw = tracing.values(prepared.raw, prepared.by_event)
        for applier, events in prepared.shares:
            group = self.settings.group_id
            with tracing.processing(applier, events, prepared.by_event, group) as span:
                outcome = apply_guarded(applier, self._conn, events, raw)
                tracing.counted(span, outcome)
            outcomes.append((applier, outcome))
        for _, outcome in outcomes:  # their offsets wait for the work carried on
            for event in outcome.deferred:
                message = prepared.by_event[event]
                self._offsets.hold(message)
                self._waiting.add(event, message)
        done = settle(self._conn, self._producer, self.settings, prepared, outcomes)
        self._offsets.done(done)  # committed by _commit_offsets

    # ------------------------------------------------------------------ work past the batch

    def _gather(self) -> None:
        """Report what routes finished past its batch; an outage in it pauses, as a batch's."""
        paused = False
        while True:
            try:
                # After a wait, the work tried again gets a moment to finish or fail, so
                # that a lasting outage is waited out with a growing delay.
                outage = self._report_carried(RETRIED_LANES_WAIT_S if paused else 0.0)
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

    def _report_carried(self, wait: float | None) -> BaseException | None:
        """Collect every route's finished work, report it, release its messages' offsets.

        Returns the outage that stopped some of the work (tried again at the next call).
        """
        outage = None
        for applier in self.routing.appliers:
            collect = getattr(applier, "collect", None)
            if callable(collect):
                carried: Carried = collect(wait)
                self._finished += [(applier, o) for o in carried.outcomes]
                outage = outage or carried.outage
        if not self._finished:
            return outage
        if self._conn is None:
            self._connect_postgres()
        if self._conn is None or self._producer is None:
            raise DependencyDownError("not connected")
        report(self._conn, self._producer, self.settings, [], self._waiting, self._finished)
        for _, outcome in self._finished:
            for event in outcome.released:
                # An event a lane took in a try of its batch that an outage failed is no
                # key here: the batch's next try gave the lane a copy, held and released.
                message = self._waiting.pop(event)
                if message is not None:
                    self._offsets.release(message)
        self._finished = []
        return outage

    def _finish_carried(self) -> None:
        """At stop: wait for the lanes, report what they did; the rest is delivered again."""
        try:
            outage = self._report_carried(None)
        except Exception as exc:
            if not waited_out(exc):
                raise
            outage = exc
        if outage is not None or self._waiting:
            log.warning(
                "consumer_stopping_with_unfinished_lanes",
                events=len(self._waiting),
                error=None if outage is None else first_line(outage),
            )

    # ------------------------------------------------------------------ dependencies

    def _check_dependencies(self) -> None:
        """While idle, ping PostgreSQL and Redis; one that is down pauses like a failed batch."""
        while not self._stopping:
            try:
                if self._conn is None:
                    self._connect_postgres()
                if self._conn is not None:
                    self._conn.execute("SELECT 1")
                if self._redis is not None:
                    self._redis.ping()
                break
            except Exception as exc:
                if not down(exc):  # a full disk answers even PING with MISCONF
                    raise
                self._pausing.pause()
                self._wait_out(exc)
        self._pausing.resume()
        self._probe_at = time.monotonic() + IDLE_PROBE_INTERVAL_S

    def _wait_out(self, exc: BaseException) -> None:
        if dependency(exc) == "postgres" and self._conn is not None:
            self._conn.close()
            self._conn = None
        self._pausing.wait(exc)


def _say_if_no_relay(conn: psycopg.Connection[Any]) -> None:
    """Warn once at start-up when no relay holds a slice of the consumer's own outbox.

    A batch route's assembled output and re-dispatched work go through that outbox; with
    no relay on it they wait there, and nothing else would say why.
    """
    try:
        row = conn.execute(
            "SELECT count(*) FROM outbox_relay_slices "
            "WHERE lease_until > now() - interval '1 minute'"
        ).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        log.info("outbox_relay_unknown", hint="grant SELECT on outbox_relay_slices to know")
        return
    if not row or not row[0]:
        log.warning(
            "outbox_relay_not_seen",
            hint="batch routes write to the outbox in DATABASE_URL: run inorder-relay on it",
        )
