"""Republish requests: re-send a range of one entity's rows and answer what was and was not sent."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from confluent_kafka import Producer

from outbox_relay import metrics, store
from outbox_relay.errors import RelayError
from outbox_relay.kafka import Sender
from outbox_relay.sending import deliver
from outbox_relay.settings import RelaySettings
from outbox_relay.store import Conn
from outbox_relay.weighing import Bounds
from schemas import PayloadSchemas, tracing
from schemas.errors import OutageError
from schemas.republish import RepublishRequest, RepublishResult, encode

log = structlog.get_logger(__name__)

# One request re-sends at most this many seqs; the sweeper asks again for the rest.
MAX_RANGE = 10_000

RangeKey = tuple[str, str, int, int, int]


class RepublishDeliveryError(RelayError, OutageError):
    """Raised when Kafka did not take every re-sent row or the answer; the request is retried."""


@dataclass(slots=True)
class Cooldown:
    """Ranges answered recently; a repeat within ``window_s`` re-sends nothing."""

    window_s: float
    clock: Callable[[], float] = time.monotonic
    _seen: dict[RangeKey, float] = field(default_factory=dict)

    def recent(self, key: RangeKey) -> bool:
        """True when ``key`` was re-sent less than ``window_s`` ago."""
        at = self._seen.get(key)
        return at is not None and self.clock() - at < self.window_s

    def note(self, key: RangeKey) -> None:
        """Remember that ``key`` was re-sent now; forget entries past the window."""
        now = self.clock()
        if len(self._seen) > 10_000:
            self._seen = {k: t for k, t in self._seen.items() if now - t < self.window_s}
        self._seen[key] = now


def bounded(request: RepublishRequest, through: int | None = None) -> RepublishRequest:
    """The part of ``request`` one answer covers: at most ``MAX_RANGE`` seqs, and none
    past ``through`` (where a read's byte budget ended it)."""
    last = min(request.to_seq, request.from_seq + MAX_RANGE - 1)
    if through is not None:
        last = min(last, through)
    if last == request.to_seq:
        return request
    return RepublishRequest(
        request.request_id,
        request.entity_type,
        request.entity_id,
        request.generation,
        request.from_seq,
        last,
        request.reason,
    )


def answer(
    conn: Conn,
    sender: Sender,
    request: RepublishRequest,
    settings: RelaySettings,
    schemas: PayloadSchemas,
    cooldown: Cooldown,
) -> RepublishResult:
    """Re-send the rows of the request's range that exist, then publish the answer.

    One answer loads at most the read budget of rows: where the budget ends the range
    first, the answer covers the range up to there, and the sweeper asks for the rest.
    """
    request = bounded(request)
    bounds = Bounds.of(settings, MAX_RANGE)
    resent: list[int] = []
    with conn.transaction():
        found = store.rows_in_range(conn, range_key(request), bounds)
        request = bounded(request, found.through)
        key = range_key(request)
        repeat = cooldown.recent(key)
        rows, failed = found.rows, found.failed
        by_id = {row.id: row for row in rows}
        if not repeat and rows:
            sent, ready = deliver(conn, sender, rows, settings, schemas, request.request_id)
            if sent.failed:  # rolls the marks back with the transaction; the request is retried
                raise RepublishDeliveryError(f"{len(sent.failed)} re-sent rows not delivered")
            failed += [by_id[row_id].seq for row_id in ready.failed]
            unsent = sent.missing() | set(ready.failed) | set(ready.aside)
            resent = sorted(row.seq for row in rows if row.id not in unsent)
    # Rows set aside for their topic are neither lost nor sent: they come once it exists.
    present = {row.seq for row in rows} | set(failed) | set(found.aside)
    result = RepublishResult(
        request.request_id,
        request.entity_type,
        request.entity_id,
        request.generation,
        request.from_seq,
        request.to_seq,
        tuple(resent),
        tuple(s for s in request.seqs if s not in present),
        tuple(sorted(failed)),
        repeat,
    )
    conclude(sender.producer, result, settings, cooldown)
    return result


def conclude(
    producer: Producer,
    result: RepublishResult,
    settings: RelaySettings,
    cooldown: Cooldown,
    **about: object,
) -> None:
    """Publish the answer, remember its range (unless it was a repeat), count and log it."""
    publish_result(producer, settings.republish_results_topic, result, settings)
    if not result.cooldown:
        cooldown.note(
            (
                result.entity_type,
                result.entity_id,
                result.generation,
                result.from_seq,
                result.to_seq,
            )
        )
    metrics.REPUBLISHED.inc(len(result.resent))
    metrics.REPUBLISH_REQUESTS.labels("cooldown" if result.cooldown else "answered").inc()
    log.info(
        "republish_answered",
        request_id=result.request_id,
        entity=f"{result.entity_type}:{result.entity_id}",
        generation=result.generation,
        from_seq=result.from_seq,
        to_seq=result.to_seq,
        resent=len(result.resent),
        missing=len(result.missing),
        failed=len(result.failed),
        cooldown=result.cooldown,
        **about,
    )


def range_key(request: RepublishRequest | RepublishResult) -> RangeKey:
    """The range an answer covers, as the cooldown remembers it."""
    return (
        request.entity_type,
        request.entity_id,
        request.generation,
        request.from_seq,
        request.to_seq,
    )


def publish_result(
    producer: Producer, topic: str, result: RepublishResult, settings: RelaySettings
) -> None:
    """Publish one answer and wait for it; ``RepublishDeliveryError`` when Kafka did not take it."""
    errors: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    headers = tracing.injected()  # the answer's context, when it is traced
    producer.produce(topic, encode(result), result.key, headers=headers, on_delivery=on_delivery)
    remaining = producer.flush(settings.delivery_timeout_ms / 1000 + 5)
    if errors or remaining:
        raise RepublishDeliveryError(f"republish answer not delivered: {errors or 'timed out'}")
