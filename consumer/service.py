"""The consumer's main loop: poll a batch, apply it, dead-letter what cannot be used, commit.

Commit order per batch: PostgreSQL, then the dead letters, then the Kafka offsets.
When a dependency fails the batch is kept, the assignment paused, and the batch
retried with backoff; nothing is skipped and no offset passes unapplied work.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import psycopg
import redis
import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from psycopg.types.json import set_json_loads

from consumer import deadletter, metrics, pipeline, tables
from consumer.batch_runner import BatchRunner
from consumer.errors import DependencyDownError, RoutesError, StoreNotDurableError
from consumer.gauges import Gauges
from consumer.offsets import Offsets, commit
from consumer.outages import DOWN, REDIS_DOWN, dependency
from consumer.parking import ParkingLot, durability_problem
from consumer.projection import ProjectionTable, check_table
from consumer.router import Router
from consumer.routes import BatchRoute, ProjectionRoute, Route, StepRoute
from consumer.settings import ConsumerSettings
from consumer.step_runner import StepRunner
from consumer.steps import StepStore, resolve
from producer import migrate
from schemas.backoff import Backoff
from schemas.health import Health
from schemas.logs import first_line
from schemas.topics import ensure_topics

log = structlog.get_logger(__name__)

# With no messages coming, how often the dependencies are checked, so that an outage
# shows in readiness and the pause gauge before the next batch runs into it.
IDLE_PROBE_INTERVAL_S = 2.0


class ConsumerService:
    """One consumer process. ``run`` returns after ``stop`` once the batch in hand is committed."""

    def __init__(self, settings: ConsumerSettings, routes: Sequence[Route], health: Health) -> None:
        self.settings = settings
        self.router = Router(routes)
        self.health = health
        # Handlers are imported once; an unimportable one is a start-up error.
        self._stores = {
            r.stream: StepStore(r, resolve(r)) for r in routes if isinstance(r, StepRoute)
        }
        self._runner: StepRunner | None = None
        batch_routes = [r for r in routes if isinstance(r, BatchRoute)]
        self._batches = BatchRunner(batch_routes) if batch_routes else None
        self._stopping = False
        self._conn: psycopg.Connection[Any] | None = None
        self._tables: Mapping[str, ProjectionTable] = {}
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._offsets = Offsets()
        self._gauges = Gauges(steps=bool(self._stores))
        self._paused = False
        self._probe_at = 0.0

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand, commit and leave the group."""
        self._stopping = True

    # ------------------------------------------------------------------ start and stop

    def connect_postgres(self) -> None:
        """Connect and check every projection table; ``RoutesError`` if a table does not fit."""
        conn = psycopg.connect(self.settings.database_url.get_secret_value(), autocommit=True)
        set_json_loads(orjson.loads, conn)
        try:
            self._tables = {
                s: check_table(conn, r)
                for s, r in self.router.routes.items()
                if isinstance(r, ProjectionRoute)
            }
            tables.create(conn)
            if self._batches is not None:  # assembled batches leave through our own outbox
                migrate.apply(conn, (migrate.OUTBOX,))
        except Exception:
            conn.close()
            raise
        self._conn = conn
        self.health.cleared("postgres")

    def connect_redis(self) -> None:
        """Connect the parking store when step routes exist, refusing one that can lose data."""
        if not self._stores or self._runner is not None:
            return
        if self.settings.redis_url is None:
            raise RoutesError(["the routes file has step routes: set REDIS_URL for parking"])
        client = redis.Redis.from_url(
            self.settings.redis_url.get_secret_value(), socket_timeout=10,
            socket_connect_timeout=5, health_check_interval=30,
        )  # fmt: skip
        client.ping()
        problem = durability_problem(client)
        if problem is not None and not self.settings.park_store_trusted:
            client.close()
            raise StoreNotDurableError(problem)
        self._runner = StepRunner(self._stores, ParkingLot(client, self.settings.redis_key_prefix))
        self.health.cleared("redis")

    def _start_kafka(self) -> None:
        config = self.settings.kafka_config()
        if self.settings.create_topics:
            batch_topics = [
                t for r in (self._batches.routes.values() if self._batches else ())
                for t in (r.output_topic, r.work_topic)
            ]  # fmt: skip
            ensure_topics(
                config,
                [*self.settings.topics, self.settings.dead_letter_topic, self.settings.held_topic,
                 *batch_topics],
                self.settings.topic_partitions,
            )  # fmt: skip
        dlq_max = self.settings.dead_letter_max_value_bytes + 262_144  # room for key and headers
        self._producer = Producer(
            {**config, "client.id": "inorder-consumer-dlq", "enable.idempotence": True,
             "acks": "all", "message.max.bytes": dlq_max}
        )  # fmt: skip
        self._consumer = Consumer(
            {**config, "client.id": "inorder-consumer", "group.id": self.settings.group_id,
             "enable.auto.commit": False, "auto.offset.reset": "earliest",
             "partition.assignment.strategy": "cooperative-sticky",
             "on_commit": self._offsets.failed}
        )  # fmt: skip
        self._consumer.subscribe(
            self.settings.topics,
            on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost,
        )  # fmt: skip
        self.health.cleared("starting")
        log.info("consumer_started", topics=self.settings.topics, group=self.settings.group_id)

    def _close(self) -> None:
        if self._consumer is not None:
            commit(self._consumer, self._offsets.pending(), wait=True)
            self._consumer.close()  # leaves the group
        if self._producer is not None:
            self._producer.flush(10)
        if self._conn is not None:
            self._conn.close()
        log.info("consumer_stopped")

    # ------------------------------------------------------------------ rebalances

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("partitions_assigned", partitions=[f"{p.topic}:{p.partition}" for p in partitions])
        self._offsets.assigned(partitions)
        consumer.incremental_assign(partitions)
        if self._paused:  # a batch is waiting on a dependency: new partitions wait too
            consumer.pause(partitions)
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
        backoff = Backoff()
        try:
            while not self._stopping and self._consumer is None:
                try:
                    if self._conn is None:
                        self.connect_postgres()
                    self.connect_redis()
                    self._start_kafka()
                except DOWN as exc:
                    self._wait_out(backoff, "startup", exc)
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
        messages = self._kafka_consumer.consume(
            num_messages=self.settings.batch_size, timeout=self.settings.poll_timeout_ms / 1000
        )
        self.health.beat()
        self._gauges.refresh(self._consumer, self._conn)
        commit(self._kafka_consumer, self._offsets.take_retries(), wait=False)
        usable = [m for m in messages if not _skip(m)]
        if usable:
            self._handle(usable)
            self._probe_at = time.monotonic() + IDLE_PROBE_INTERVAL_S
        elif time.monotonic() >= self._probe_at:
            self._check_dependencies()

    def _handle(self, messages: list[Message]) -> None:
        started = time.perf_counter()
        metrics.CONSUMED.inc(len(messages))
        metrics.BATCH_SIZE.observe(len(messages))
        prepared = pipeline.prepare(messages, self.router, self.settings.max_message_bytes)
        backoff = Backoff()
        while messages:
            try:
                self._commit_batch(prepared)
                break
            except (*DOWN, DependencyDownError) as exc:
                self._pause()
                self._wait_out(backoff, dependency(exc), exc)
                if self._stopping:
                    log.warning("consumer_stopping_with_unapplied_batch", messages=len(messages))
                    return
                messages = [m for m in messages if self._offsets.ours(m)]
                prepared = pipeline.prepare(messages, self.router, self.settings.max_message_bytes)
        self._resume()
        metrics.BATCH_DURATION.observe(time.perf_counter() - started)

    def _commit_batch(self, prepared: pipeline.Prepared) -> None:
        if self._conn is None:
            self.connect_postgres()
        if self._conn is None or self._producer is None:
            raise DependencyDownError("not connected")
        refused = pipeline.apply_projections(self._conn, self._tables, prepared)
        batch_outcome = None
        if self._batches is not None:
            batch_outcome = self._batches.process(self._conn, prepared.by_stream)
            refused += pipeline.batch_letters(prepared, batch_outcome.refused)
        held = []
        if self._runner is not None:
            held = self._runner.process(self._conn, prepared.by_stream, prepared.raw)
        deadletter.send(
            self._producer, self.settings.dead_letter_topic, prepared.dead + refused,
            self.settings.dead_letter_max_value_bytes,
        )  # fmt: skip
        deadletter.send(
            self._producer, self.settings.held_topic, pipeline.held_letters(prepared, held),
            self.settings.dead_letter_max_value_bytes,
        )  # fmt: skip
        deadletter.record(self._conn, prepared.dead + refused)
        if batch_outcome is not None:
            batch_outcome.count()
        if refused or prepared.dead:
            for dead in prepared.dead + refused:
                log.warning(
                    "event_dead_lettered", reason=dead.reason, detail=dead.detail[:200],
                    topic=dead.message.topic(), partition=dead.message.partition(),
                    offset=dead.message.offset(),
                )  # fmt: skip
        # The effects are committed, so the offsets may go asynchronously: a commit that is
        # lost only means a redelivery, which is harmless. Stop and revoke commit synchronously.
        offsets = pipeline.next_offsets(prepared.messages)
        self._offsets.done(offsets)
        commit(self._kafka_consumer, offsets, wait=False)

    # ------------------------------------------------------------------ dependencies

    def _check_dependencies(self) -> None:
        """While idle, ping PostgreSQL and Redis; one that is down pauses like a failed batch."""
        backoff = Backoff()
        while not self._stopping:
            try:
                if self._conn is None:
                    self.connect_postgres()
                if self._conn is not None:
                    self._conn.execute("SELECT 1")
                if self._runner is not None:
                    self._runner.lot.client.ping()
                break
            except (psycopg.OperationalError, *REDIS_DOWN) as exc:
                self._pause()
                self._wait_out(backoff, dependency(exc), exc)
        self._resume()
        self._probe_at = time.monotonic() + IDLE_PROBE_INTERVAL_S

    def _pause(self) -> None:
        consumer = self._kafka_consumer
        assignment = consumer.assignment()
        if assignment:
            consumer.pause(assignment)
        self._paused = True
        metrics.PAUSED.set(1)

    def _resume(self) -> None:
        if not self._paused:
            return
        consumer = self._kafka_consumer
        assignment = consumer.assignment()
        if assignment:
            consumer.resume(assignment)
        self._paused = False
        metrics.PAUSED.set(0)
        for name in ("postgres", "kafka", "redis"):
            self.health.cleared(name)
        log.info("consumption_resumed")

    def _wait_out(self, backoff: Backoff, dependency: str, exc: Exception) -> None:
        delay = backoff.failed()
        detail = first_line(exc)
        self.health.blocked(dependency, detail)
        log.warning(f"{dependency}_unavailable", error=detail, retry_in_s=delay, paused=True)
        if dependency == "postgres" and self._conn is not None:
            self._conn.close()
            self._conn = None
        deadline = time.monotonic() + delay
        while not self._stopping and time.monotonic() < deadline:
            self.health.beat()
            if self._consumer is not None:
                # Polling keeps the group membership alive and serves rebalances; paused
                # partitions return nothing, and anything that does arrive is fetched again later.
                for message in self._consumer.consume(num_messages=1, timeout=0.2):
                    if message.error() is None:
                        self._put_back(message)
            else:
                time.sleep(0.2)

    def _put_back(self, message: Message) -> None:
        """Fetch ``message`` again once consumption resumes, instead of dropping it."""
        where = TopicPartition(
            message.topic() or "", message.partition() or 0, message.offset() or 0
        )
        self._kafka_consumer.seek(where)
        self._kafka_consumer.pause([where])


def _skip(message: Message) -> bool:
    error = message.error()
    if error is None:
        return False
    if error.code() != KafkaError._PARTITION_EOF:
        log.warning("kafka_consume_error", error=str(error))
    return True
