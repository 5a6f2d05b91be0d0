"""The relay's main loop: publish, answer republish requests, purge, measure.

A dependency that is down pauses the loop with backoff; it never ends it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import suppress
from typing import Any

import orjson
import psycopg
import structlog
from confluent_kafka import Consumer, KafkaException, Producer
from psycopg.types.json import set_json_loads

from outbox_relay import metrics, store
from outbox_relay.errors import SchemaNotReadyError
from outbox_relay.kafka import make_producer, make_request_consumer
from outbox_relay.publisher import BatchOutcome, publish_batch
from outbox_relay.republisher import Cooldown, RepublishDeliveryError, answer
from outbox_relay.settings import RelaySettings
from schemas import DecodeError, PayloadSchemas, default_payload_schemas
from schemas.republish import decode_request
from schemas.runtime.health import Health
from schemas.runtime.outages import Outages
from schemas.topics import ensure_topics

log = structlog.get_logger(__name__)

NOTIFY_CHANNEL = "inorder_outbox"
# The loop looks at notifications, requests and the stop flag at least this often.
TICK_S = 0.2
# How long to wait for metadata when checking whether brokers are back.
BROKER_CHECK_S = 2.0
# Backlog gauges are refreshed this often.
MEASURE_INTERVAL_S = 5.0


class Relay:
    """One relay process. ``run`` returns after ``stop`` once in-flight work is marked."""

    def __init__(
        self,
        settings: RelaySettings,
        health: Health,
        *,
        listen: bool = True,
        schemas: PayloadSchemas | None = None,
    ) -> None:
        self.settings = settings
        self.health = health
        self.listen = listen
        self.schemas = schemas or default_payload_schemas()
        self.cooldown = Cooldown(settings.republish_cooldown_s)
        self._stopping = False
        self._conn: psycopg.Connection[Any] | None = None
        # The second publishing connection, when marking overlaps the next batch.
        self._second: psycopg.Connection[Any] | None = None
        self._lanes = (
            ThreadPoolExecutor(2, thread_name_prefix="inorder-publish")
            if settings.overlap_marking
            else None
        )
        self._listener: psycopg.Connection[Any] | None = None
        self._producer: Producer | None = None
        self._requests: Consumer | None = None
        self._next_purge = 0.0
        self._next_measure = 0.0
        self._last_request_error: str | None = None
        self._outages = Outages("relay", health, lambda: self._stopping)

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand and return."""
        self._stopping = True

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Serve until ``stop``; a dependency that is down pauses the relay, never ends it."""
        try:
            while not self._stopping:
                try:
                    self._connect()
                    self._cycle()
                    self._outages.recovered()
                except (psycopg.OperationalError, SchemaNotReadyError) as exc:
                    self._close_postgres()
                    self._outages.wait(exc, on="postgres")
                except (KafkaException, RepublishDeliveryError) as exc:
                    # Kafka is down: the backlog and its age are what operators watch now.
                    with suppress(psycopg.OperationalError):
                        self._measure()
                    self._outages.wait(exc, on="kafka")
        finally:
            self._close()

    def _cycle(self) -> None:
        published_full = self._publish_until_idle()
        self._answer_requests()
        self._housekeeping()
        self.health.beat()
        if not published_full:
            self._wait_for_work()

    # ------------------------------------------------------------------ work

    def _publish_until_idle(self) -> bool:
        """Publish batches while they come back full; True if the last one was full."""
        if self._lanes is not None:
            return self._publish_overlapped(self._lanes)
        while not self._stopping:
            self._check_brokers()
            outcome = publish_batch(self._db, self._kafka, self.settings, self.schemas)
            self._settled(outcome)
            if outcome.claimed < self.settings.batch_size:
                return False
        return True

    def _publish_overlapped(self, lanes: ThreadPoolExecutor) -> bool:
        """``_publish_until_idle`` with two connections taking turns.

        Batch N+1 is claimed (skipping the rows batch N still locks) and sent while
        batch N's rows are marked published. Batch N+1 starts only once batch N is
        sent, and batch N+2 only once batch N is committed, so sends never overlap and
        one relay still publishes in id order.
        """
        conns = (self._db, _connected(self._second))
        in_hand: list[Future[BatchOutcome]] = []  # at most the one marking and the next
        full = False
        try:
            turn = 0
            while not self._stopping:
                self._check_brokers()
                sent = threading.Event()
                claimed: list[int] = []

                def on_sent(
                    count: int, claimed: list[int] = claimed, sent: threading.Event = sent
                ) -> None:
                    claimed.append(count)
                    sent.set()

                batch = lanes.submit(
                    publish_batch,
                    conns[turn % 2],
                    self._kafka,
                    self.settings,
                    self.schemas,
                    on_sent,
                )
                in_hand.append(batch)
                turn += 1
                while not sent.wait(TICK_S) and not batch.done():
                    self.health.beat()
                if len(in_hand) == 2:
                    self._settled(in_hand.pop(0).result())
                full = bool(claimed) and claimed[0] >= self.settings.batch_size
                if not full:
                    break
        finally:
            wait(in_hand)  # every batch in hand commits or rolls back before anything else
        for batch in in_hand:
            self._settled(batch.result())
        return full

    def _settled(self, outcome: BatchOutcome) -> None:
        if outcome.published or outcome.claimed:
            self.health.cleared("kafka")
        if outcome.delivery_failures:
            raise KafkaException(f"{outcome.delivery_failures} deliveries failed")

    def _check_brokers(self) -> None:
        """While every broker is known down, ask Kafka first instead of claiming rows.

        Claimed rows stay locked until their deliveries time out; asking first keeps an
        outage from holding them, and lets the backlog gauges be measured meanwhile.
        """
        if "kafka" not in self.health.problems or self._producer is None:
            return
        self._producer.list_topics(timeout=BROKER_CHECK_S)  # KafkaException while down
        self.health.cleared("kafka")

    def _answer_requests(self) -> None:
        if self._requests is None:
            return
        for message in self._requests.consume(num_messages=50, timeout=0):
            if message.error() is not None:
                self._request_error(str(message.error()))
                continue
            self._last_request_error = None
            try:
                request = decode_request(message.value())
            except DecodeError as exc:
                metrics.REPUBLISH_REQUESTS.labels("invalid").inc()
                log.error(  # noqa: TRY400 - expected bad input; a traceback adds nothing
                    "republish_request_invalid", reason=exc.detail, offset=message.offset()
                )
            else:
                answer(self._db, self._kafka, request, self.settings, self.schemas, self.cooldown)
            self._requests.commit(message=message, asynchronous=False)

    def _request_error(self, error: str) -> None:
        """Log a request-topic error once, not on every poll while it lasts."""
        if error != self._last_request_error:
            log.warning("republish_request_error", error=error)
            self._last_request_error = error

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now >= self._next_purge:
            self._next_purge = now + self.settings.purge_interval_s
            self._purge()
        if now >= self._next_measure:
            self._measure()

    def _measure(self) -> None:
        self._next_measure = time.monotonic() + MEASURE_INTERVAL_S
        backlog = store.backlog(self._db)
        metrics.BACKLOG.set(backlog.rows)
        metrics.OLDEST_AGE.set(backlog.oldest_age_s)
        metrics.FAILED_ROWS.set(backlog.failed)

    def _purge(self) -> None:
        total = 0
        while not self._stopping:
            deleted = store.purge_batch(
                self._db, self.settings.retention_s, self.settings.purge_batch_rows
            )
            total += deleted
            if deleted < self.settings.purge_batch_rows:
                break
        if total:
            metrics.PURGED.inc(total)
            log.info("outbox_purged", rows=total, retention_s=self.settings.retention_s)

    def _wait_for_work(self) -> None:
        """Until the poll interval passes or a NOTIFY arrives; requests are served meanwhile."""
        deadline = time.monotonic() + self.settings.poll_interval_s
        while not self._stopping and time.monotonic() < deadline:
            slice_s = min(TICK_S, max(0.0, deadline - time.monotonic()))
            if self._listener is not None:
                if any(True for _ in self._listener.notifies(timeout=slice_s, stop_after=1)):
                    return
            else:
                time.sleep(slice_s)
            self._answer_requests()
            self.health.beat()

    # ------------------------------------------------------------------ connections

    @property
    def _db(self) -> psycopg.Connection[Any]:
        return _connected(self._conn)

    @property
    def _kafka(self) -> Producer:
        if self._producer is None:
            raise KafkaException("Kafka producer not started")
        return self._producer

    def _connect(self) -> None:
        url = self.settings.database_url.get_secret_value()
        if self._conn is None:
            conn = _publishing_connection(url)
            try:
                store.check_schema(conn)
            except SchemaNotReadyError:
                conn.close()
                raise
            self._conn = conn
            if self._lanes is not None:
                self._second = _publishing_connection(url)
            if self.listen:
                self._listener = psycopg.connect(url, autocommit=True)
                self._listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self.health.cleared("postgres")
            log.info("postgres_connected", listen=self.listen)
        if self._producer is None:
            if self.settings.create_topics:
                ensure_topics(
                    self.settings.kafka_config(),
                    [self.settings.republish_requests_topic, self.settings.republish_results_topic],
                    self.settings.topic_partitions,
                )
            self._producer = make_producer(self.settings, self.health)
            self._requests = make_request_consumer(self.settings)
            self.health.cleared("starting")
            log.info("relay_started", batch_size=self.settings.batch_size)

    def _close_postgres(self) -> None:
        for conn in (self._conn, self._second, self._listener):
            if conn is not None:
                conn.close()
        self._conn = self._second = self._listener = None

    def _close(self) -> None:
        if self._lanes is not None:
            self._lanes.shutdown(wait=True)
        if self._producer is not None:
            left = self._producer.flush(self.settings.delivery_timeout_ms / 1000)
            log.info("relay_stopped", undelivered=left)
        if self._requests is not None:
            self._requests.close()
        self._close_postgres()


def _connected(conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any]:
    if conn is None:
        raise psycopg.OperationalError("not connected to PostgreSQL")
    return conn


def _publishing_connection(url: str) -> psycopg.Connection[Any]:
    """A connection that claims and marks rows (JSON columns read by orjson)."""
    conn = psycopg.connect(url, autocommit=True)
    set_json_loads(orjson.loads, conn)
    return conn
