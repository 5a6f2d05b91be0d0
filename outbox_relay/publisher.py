"""Publishing: claim pending rows, send them, mark them published only once Kafka has them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from confluent_kafka import Producer

from outbox_relay import metrics, store
from outbox_relay.errors import RowProblem
from outbox_relay.kafka import Sent, send
from outbox_relay.rows import Message, OutboxRow, to_message
from outbox_relay.settings import RelaySettings
from outbox_relay.store import Conn
from schemas import PayloadSchemas

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What one claim did."""

    claimed: int
    published: int
    failed_rows: int
    delivery_failures: int


def prepare(
    conn: Conn,
    rows: list[OutboxRow],
    settings: RelaySettings,
    schemas: PayloadSchemas,
    republish_request: str | None = None,
) -> tuple[list[Message], list[int]]:
    """Messages for the sendable rows; rows that cannot be sent are marked failed."""
    now = datetime.now(UTC).isoformat()
    messages: list[Message] = []
    failed: list[int] = []
    for row in rows:
        try:
            message = to_message(
                row,
                now,
                schemas=schemas,
                max_bytes=settings.max_message_bytes,
                republish_request=republish_request,
            )
        except RowProblem as problem:
            fail(conn, row, problem.reason, str(problem))
            failed.append(row.id)
        else:
            messages.append(message)
    return messages, failed


def fail(conn: Conn, row: OutboxRow, reason: str, detail: str) -> None:
    """Mark one row failed, count it and say so in the log."""
    store.mark_failed(conn, row.id, detail)
    metrics.ROWS_FAILED.labels(reason).inc()
    log.error(
        "outbox_row_failed",
        row_id=row.id,
        entity=f"{row.entity_type}:{row.entity_id}",
        generation=row.generation,
        seq=row.seq,
        reason=reason,
        detail=detail,
    )


def deliver(
    conn: Conn,
    producer: Producer,
    rows: list[OutboxRow],
    settings: RelaySettings,
    schemas: PayloadSchemas,
    republish_request: str | None = None,
    on_sent: Callable[[], None] | None = None,
) -> tuple[Sent, list[int]]:
    """Send rows in the caller's transaction: mark the ones Kafka took, fail the ones it never will.

    ``on_sent`` is called once Kafka has answered for every row, before the marking.
    Returns what Kafka reported and the ids of every row marked failed (unsendable or refused).
    """
    messages, failed = prepare(conn, rows, settings, schemas, republish_request)
    by_id = {row.id: row for row in rows}
    created = {row.id: row.created_at.timestamp() for row in rows}
    sent = send(producer, messages, created, settings.delivery_timeout_ms / 1000 + 5)
    if on_sent is not None:
        on_sent()
    for row_id, reason in sent.rejected:
        fail(conn, by_id[row_id], "kafka_rejected", f"Kafka refused the message: {reason}")
    store.mark_published(conn, sent.delivered)
    return sent, failed + [row_id for row_id, _ in sent.rejected]


def publish_batch(
    conn: Conn,
    producer: Producer,
    settings: RelaySettings,
    schemas: PayloadSchemas,
    on_sent: Callable[[int], None] | None = None,
) -> BatchOutcome:
    """Claim one batch, send it, and mark what Kafka acknowledged, in one transaction.

    The row locks keep other relays off these rows until the marks commit; rows
    whose delivery failed stay pending for the next claim. ``on_sent`` gets the
    number of rows claimed as soon as they are sent (0 if none were pending), while
    the marking is still to come.
    """
    with conn.transaction():
        rows = store.claim(conn, settings.batch_size)
        if not rows:
            if on_sent is not None:
                on_sent(0)
            return BatchOutcome(0, 0, 0, 0)
        sent, failed = deliver(
            conn,
            producer,
            rows,
            settings,
            schemas,
            on_sent=None if on_sent is None else lambda: on_sent(len(rows)),
        )
    metrics.PUBLISHED.inc(len(sent.delivered))
    for _, reason in sent.failed:
        metrics.PUBLISH_FAILURES.labels(reason).inc()
    if sent.failed:
        log.warning(
            "kafka_delivery_failed",
            rows=len(sent.failed),
            reason=sent.failed[0][1],
            published=len(sent.delivered),
        )
    return BatchOutcome(len(rows), len(sent.delivered), len(failed), len(sent.failed))
