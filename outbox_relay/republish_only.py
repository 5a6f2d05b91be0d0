"""The relay's republish-only role: answer republish requests from a Debezium outbox table.

Debezium publishes the table; this role publishes nothing of its own accord. When a
consumer's sweeper asks for a range of an entity's events again, it reads those rows from
the user's table and sends each as Debezium's outbox event router would have (same topic,
key, headers and value), then publishes the answer: which seqs it re-sent, which the table
does not hold (lost for good), which it could not send. The sweeper's gap repair then
works for a Debezium user as it does with inorder's relay. A dependency that is down
pauses the role with backoff; a table or column the settings name that is not there
stops start-up with one line.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

import psycopg
import structlog
from confluent_kafka import KafkaError, KafkaException, Producer

from outbox_relay.foreign_table import ForeignTable
from outbox_relay.republisher import (
    MAX_RANGE,
    Cooldown,
    RepublishDeliveryError,
    bounded,
    conclude,
    range_key,
)
from outbox_relay.requests import Requests
from outbox_relay.settings import RelaySettings
from schemas import debezium
from schemas.republish import RepublishRequest, RepublishResult
from schemas.runtime import kafka_clients, postgres
from schemas.runtime.causes import Cause, kafka_cause
from schemas.runtime.health import Health
from schemas.runtime.outages import Outages, dependency, waited_out

log = structlog.get_logger(__name__)

# How long one read of the request topic waits when no request is there.
TICK_S = 0.2


class RepublishOnly:
    """One republish-only relay. ``run`` returns after ``stop``."""

    def __init__(self, settings: RelaySettings, health: Health) -> None:
        self.settings = settings
        self.health = health
        self.table = ForeignTable(settings)
        self.cooldown = Cooldown(settings.republish_cooldown_s)
        self._stopping = False
        self._conn: psycopg.Connection[Any] | None = None
        self._producer: Producer | None = None
        self._requests: Requests | None = None
        self._outages = Outages("relay", health, lambda: self._stopping)

    def stop(self) -> None:
        """Ask the loop to finish the request in hand and return."""
        self._stopping = True

    def run(self) -> None:
        """Serve until ``stop``; a dependency that is down pauses the role, never ends it."""
        try:
            while not self._stopping:
                try:
                    self._connect()
                    assert self._requests is not None
                    self._requests.serve(wait_s=TICK_S)
                    self.health.beat()
                    self._outages.recovered()
                except Exception as exc:
                    if not waited_out(exc):
                        raise
                    if dependency(exc) == "postgres":
                        self._close_postgres()
                    self._outages.wait(exc, on=dependency(exc))
        finally:
            self._close()

    def answer(self, request: RepublishRequest) -> RepublishResult:
        """Re-send the rows of the request's range the table holds, then publish the answer."""
        request = bounded(request)
        conn, producer = self._db, self._kafka
        with conn.transaction():
            found = self.table.rows_in_range(
                conn, request.entity_type, request.entity_id, request.generation, request.seqs
            )
        request = bounded(request, found.through)
        repeat = self.cooldown.recent(range_key(request))
        rows = [r for r in found.rows if int(r["seq"]) <= request.to_seq]
        failed = {s for s in found.too_large if s <= request.to_seq}
        if not repeat:
            failed |= self._send(producer, rows)
        present = {int(r["seq"]) for r in rows} | failed
        resent = () if repeat else tuple(sorted({int(r["seq"]) for r in rows} - failed))
        result = RepublishResult(
            request.request_id,
            request.entity_type,
            request.entity_id,
            request.generation,
            request.from_seq,
            request.to_seq,
            resent,
            tuple(s for s in request.seqs if s not in present),
            tuple(sorted(failed)),
            repeat,
        )
        conclude(producer, result, self.settings, self.cooldown, table=self.table.name)
        return result

    def _send(self, producer: Producer, rows: list[dict[str, Any]]) -> set[int]:
        """Send each row as the router would; the seqs Kafka refused for good (too large).

        A delivery that failed for now raises: the request is read again and answered
        once Kafka takes everything.
        """
        refused: set[int] = set()
        later: list[str] = []

        def delivered(seq: int) -> Callable[[KafkaError | None, object], None]:
            def report(err: KafkaError | None, _msg: object) -> None:
                if err is None:
                    return
                if kafka_cause(err.code()) is Cause.INPUT:
                    refused.add(seq)
                else:
                    later.append(err.name())

            return report

        for row in rows:
            message = debezium.message(self.table.shape, self.table.fields, row)
            seq = int(row["seq"])

            def send(message: debezium.Message = message, seq: int = seq) -> None:
                producer.produce(
                    message.topic,
                    message.value,
                    message.key,
                    headers=message.headers,
                    on_delivery=delivered(seq),
                )

            try:
                try:
                    send()
                except BufferError:  # the local queue is full: let it drain, once
                    producer.flush(self.settings.delivery_timeout_ms / 1000)
                    send()
            except KafkaException as exc:
                if kafka_cause(exc.args[0].code()) is not Cause.INPUT:
                    raise
                refused.add(seq)
        left = producer.flush(self.settings.delivery_timeout_ms / 1000 + 5)
        if later or left:
            raise RepublishDeliveryError(f"re-sent rows not delivered: {later[:3] or 'timed out'}")
        return refused

    # ------------------------------------------------------------------ connections

    @property
    def _db(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise psycopg.OperationalError("not connected to PostgreSQL")
        return self._conn

    @property
    def _kafka(self) -> Producer:
        if self._producer is None:
            raise KafkaException("Kafka producer not started")
        return self._producer

    def _connect(self) -> None:
        if self._conn is None:
            conn = postgres.connect(self.settings.database_url.get_secret_value(), "inorder-relay")
            try:
                self.table.check(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            self.health.cleared("postgres")
            log.info("postgres_connected", table=self.table.name, role="republish_only")
        if self._producer is None:
            self._producer = kafka_clients.producer(
                self.settings,
                "inorder-relay",
                fixed={
                    "linger.ms": 0,
                    # Same partition for a key as Debezium's (Java) producer chooses.
                    "partitioner": "murmur2_random",
                    "message.timeout.ms": self.settings.delivery_timeout_ms,
                    "message.max.bytes": self.settings.max_message_bytes + 65_536,
                },
            )
            self._requests = Requests(self.settings, self.answer)
            self.health.cleared("starting")
            log.info("relay_started", role="republish_only", max_range=MAX_RANGE)

    def _close_postgres(self) -> None:
        if self._conn is not None:
            with suppress(psycopg.Error):
                self._conn.close()
        self._conn = None

    def _close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.settings.delivery_timeout_ms / 1000)
        if self._requests is not None:
            self._requests.close()
        self._close_postgres()
