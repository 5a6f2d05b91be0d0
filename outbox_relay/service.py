"""The relay's main loop: share the slices, publish, answer republish requests, purge, measure.

A dependency that is down pauses the loop with backoff; it never ends it.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from contextlib import suppress
from typing import Any

import psycopg
import structlog
from confluent_kafka import KafkaException

from outbox_relay import leases, metrics, missing_topics, resend, sharing, store
from outbox_relay.errors import SchemaNotReadyError
from outbox_relay.frontier import Cursor
from outbox_relay.housekeeping import Housekeeper
from outbox_relay.kafka import Sender
from outbox_relay.publisher import Publisher
from outbox_relay.reading import Reader
from outbox_relay.republisher import Cooldown, answer
from outbox_relay.requests import Requests
from outbox_relay.settings import RelaySettings
from outbox_relay.topics import UNKNOWN_TOPIC
from schemas import PayloadSchemas
from schemas.republish import RepublishRequest
from schemas.runtime import postgres
from schemas.runtime.health import Health
from schemas.runtime.outages import Outages, dependency, waited_out
from schemas.runtime.payloads import registry_of
from schemas.topics import ensure_topics

log = structlog.get_logger(__name__)

NOTIFY_CHANNEL = "inorder_outbox"
# The loop looks at notifications, requests and the stop flag at least this often, and
# publishes for at most this long before doing so.
TICK_S = 0.2
# How long to wait for metadata when checking whether brokers are back.
BROKER_CHECK_S = 2.0


class Relay:
    """One relay process. ``run`` returns after ``stop`` once the batch in hand is settled."""

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
        self.schemas = schemas or registry_of(settings)
        self.cooldown = Cooldown(settings.republish_cooldown_s)
        self.relay_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.owned: dict[int, Cursor] = {}
        self._stopping = False
        self._conn: psycopg.Connection[Any] | None = None
        self._listener: psycopg.Connection[Any] | None = None
        self._reader: Reader | None = None
        self._sender: Sender | None = None
        self._requests: Requests | None = None
        self._resend = True  # rows listed to send ahead of the cursors, looked for each share
        self._next_share = 0.0
        self._housekeeper = Housekeeper(settings, lambda: dict(self.owned))
        self._outages = Outages("relay", health, lambda: self._stopping)

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand and return."""
        self._stopping = True

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Serve until ``stop``; a dependency that is down pauses the relay, never ends it."""
        self._housekeeper.start()
        try:
            while not self._stopping:
                try:
                    self._connect()
                    self._cycle()
                    self._outages.recovered()
                except Exception as exc:
                    if not waited_out(exc):
                        raise
                    self._wait_out(exc)
        finally:
            self._close()

    def _wait_out(self, exc: Exception) -> None:
        if isinstance(exc, SchemaNotReadyError) or dependency(exc) == "postgres":
            self._close_postgres()
            self._outages.wait(exc, on="postgres")
        else:
            # The backlog gauges, measured meanwhile, are what operators watch now.
            self._outages.wait(exc, on=dependency(exc))

    def _cycle(self) -> None:
        self._share()
        busy = self._publish()
        self._answer_requests()
        self.health.beat()
        if not busy:
            self._wait_for_work()

    # ------------------------------------------------------------------ work

    def _share(self) -> None:
        """Renew the leases held, and take or give back slices towards a fair share."""
        now = time.monotonic()
        if now < self._next_share:
            return
        self._next_share = now + self.settings.lease_s / 3
        grace_s = self.settings.unknown_topic_grace_s
        tended = missing_topics.tend(self._db, self._kafka.topics.present, grace_s)
        if tended.revived:
            log.info("rows_revived", rows=tended.revived, reason="their topic exists now")
        if tended.failed:
            metrics.ROWS_FAILED.labels(UNKNOWN_TOPIC).inc(tended.failed)
            log.error("outbox_rows_failed", rows=tended.failed, reason=UNKNOWN_TOPIC)
        self._resend = self._resend or tended.revived > 0 or resend.pending(self._db)
        lease_s = self.settings.lease_s
        held, seen = leases.heartbeat(
            self._db, self.relay_id, list(self.owned), lease_s, self.settings.retention_s
        )
        for slice_ in set(self.owned) - held:
            del self.owned[slice_]
            log.warning("slice_lost", slice=slice_, reason="lease expired and taken")
        plan = sharing.plan(self.relay_id, seen.live, self.owned, seen.available, seen.slices)
        if plan.release:
            leases.release(self._db, self.relay_id, list(plan.release))
            for slice_ in plan.release:
                del self.owned[slice_]
        if plan.take:
            self.owned.update(leases.take(self._db, self.relay_id, list(plan.take), lease_s))
        if plan.take or plan.release:
            log.info(
                "slices_shared",
                owned=sorted(self.owned),
                relays=len(seen.live),
                taken=list(plan.take),
                released=list(plan.release),
            )
        metrics.SLICES_OWNED.set(len(self.owned))

    def _publish(self) -> bool:
        """Publish what is waiting; True when there may be more right away."""
        self._check_brokers()
        if self._resend:
            sent = resend.drain(self._db, self._kafka, self.settings, self.schemas)
            self._resend = sent > 0 or resend.pending(self._db)
            if self._resend:
                return True
        if not self.owned:
            return False
        if self._reader is None:
            self._reader = Reader(self.settings.database_url.get_secret_value())
        publisher = Publisher(
            self._db, self._reader, self._kafka, self.settings, self.schemas, self.relay_id
        )
        outcome = publisher.publish(self.owned, TICK_S, lambda: self._stopping)
        if outcome.rows:
            self.health.cleared("kafka")
        return outcome.full

    def _check_brokers(self) -> None:
        """While every broker is known down, ask Kafka first instead of reading rows."""
        if "kafka" not in self.health.problems or self._sender is None:
            return
        self._sender.producer.list_topics(timeout=BROKER_CHECK_S)  # KafkaException while down
        self.health.cleared("kafka")

    def _answer_requests(self) -> None:
        if self._requests is not None:
            self._requests.serve()

    def _answer(self, request: RepublishRequest) -> None:
        """Re-send the rows one request asks for and publish the answer."""
        answer(self._db, self._kafka, request, self.settings, self.schemas, self.cooldown)

    def _wait_for_work(self) -> None:
        """Until the poll interval passes or a NOTIFY arrives; requests are served meanwhile."""
        deadline = min(
            time.monotonic() + self.settings.poll_interval_s,
            max(self._next_share, time.monotonic() + TICK_S),
        )
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
        if self._conn is None:
            raise psycopg.OperationalError("not connected to PostgreSQL")
        return self._conn

    @property
    def _kafka(self) -> Sender:
        if self._sender is None:
            raise KafkaException("Kafka producer not started")
        return self._sender

    def _connect(self) -> None:
        url = self.settings.database_url.get_secret_value()
        if self._conn is None:
            conn = store.connect(url)
            # The relay's own writes (cursors, leases, failed marks) need not wait for the
            # WAL to reach disk: one lost in a crash only re-sends the batch it covered, which
            # the consumers drop, or re-marks a row. Producers' commits are untouched.
            conn.execute("SET synchronous_commit TO off")
            try:
                store.check_schema(conn)
                store.check_cluster(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            self._next_share = 0.0  # leases may have lapsed while away: look again now
            if self.listen:
                self._listener = postgres.connect(url, "inorder-relay")
                self._listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self.health.cleared("postgres")
            log.info("postgres_connected", listen=self.listen, relay_id=self.relay_id)
        if self._sender is None:
            if self.settings.create_topics:
                ensure_topics(
                    self.settings.kafka_config(),
                    [self.settings.republish_requests_topic, self.settings.republish_results_topic],
                    self.settings.topic_partitions,
                    factor=self.settings.topic_replication_factor,
                    min_insync=self.settings.topic_min_insync_replicas,
                )
            self._sender = Sender(self.settings, self.health)
            self._requests = Requests(self.settings, self._answer)
            self.health.cleared("starting")
            log.info("relay_started", read_rows=self.settings.read_rows)

    def _close_postgres(self) -> None:
        for conn in (self._conn, self._listener):
            if conn is not None:
                conn.close()
        self._conn = self._listener = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _close(self) -> None:
        self._housekeeper.stop()
        if self._sender is not None:
            left = self._sender.producer.flush(self.settings.delivery_timeout_ms / 1000)
            log.info("relay_stopped", undelivered=left)
        if self._requests is not None:
            self._requests.close()
        if self._conn is not None:
            with suppress(psycopg.Error):
                leases.leave(self._conn, self.relay_id)  # others take over at once
        self.owned.clear()
        self._close_postgres()
