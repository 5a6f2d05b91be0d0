"""Rows to messages and back: what cannot be sent is marked failed (or set aside), what Kafka
refused too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
import structlog

from outbox_relay import metrics, store
from outbox_relay.kafka import Sender, Sent
from outbox_relay.rows import ID, TOPIC, Message, Row, named, to_messages
from outbox_relay.settings import RelaySettings
from outbox_relay.store import Conn
from outbox_relay.topics import AWAITING_TOPIC
from schemas import PayloadSchemas
from schemas.limits import safe_text

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Prepared:
    """Rows made ready: messages to send, and the ids marked failed or set aside."""

    messages: list[Message]
    failed: list[int]
    aside: list[int]


def prepare(
    conn: Conn,
    sender: Sender,
    rows: Sequence[Row],
    settings: RelaySettings,
    schemas: PayloadSchemas,
    republish_request: str | None = None,
) -> Prepared:
    """Messages for the sendable rows; rows that cannot be sent are marked failed.

    Rows naming a topic the cluster does not have yet are marked too, as set aside
    (``awaiting_topic``): ``missing_topics`` sends them once it has.
    """
    now = orjson.dumps(datetime.now(UTC).isoformat()).decode()
    topics = sender.topics.check(row[TOPIC] for row in rows)
    messages, problems = to_messages(
        rows,
        now,
        schemas=schemas,
        max_bytes=settings.max_message_bytes,
        republish_request=republish_request,
        topic_problems=topics.refused,
        cloudevents=settings.envelope == "cloudevents",
    )
    failed: list[int] = []
    aside: list[int] = []
    for row, problem in problems:
        mark_unsent(conn, row, problem.reason, str(problem))
        (aside if problem.reason == AWAITING_TOPIC else failed).append(row[ID])
    return Prepared(messages, failed, aside)


def mark_unsent(conn: Conn, failed: Row, reason: str, detail: str) -> None:
    """Mark one row with the reason it is not sent (failed, or awaiting its topic), count
    a failure and say so in the log."""
    row = named(failed)
    store.mark_failed(conn, row.id, safe_text(detail))
    aside = reason == AWAITING_TOPIC
    if not aside:
        metrics.ROWS_FAILED.labels(reason).inc()
    (log.warning if aside else log.error)(
        "outbox_row_set_aside" if aside else "outbox_row_failed",
        row_id=row.id,
        entity=f"{row.entity_type}:{row.entity_id}",
        generation=row.generation,
        seq=row.seq,
        reason=reason,
        detail=detail,
    )


def settle(conn: Conn, rows: dict[int, Row], sent: Sent) -> None:
    """Mark the rows Kafka refused for good as failed, and count the rest of the outcome."""
    for row_id, reason in sent.rejected:
        mark_unsent(conn, rows[row_id], "kafka_rejected", f"Kafka refused the message: {reason}")
    for _, reason in sent.failed:
        metrics.PUBLISH_FAILURES.labels(reason).inc()


def deliver(
    conn: Conn,
    sender: Sender,
    rows: Sequence[Row],
    settings: RelaySettings,
    schemas: PayloadSchemas,
    republish_request: str | None = None,
) -> tuple[Sent, Prepared]:
    """Send rows and wait for Kafka: what it reported, and the rows marked failed (with
    those Kafka refused) or set aside."""
    ready = prepare(conn, sender, rows, settings, schemas, republish_request)
    sent = sender.send(ready.messages, settings.delivery_timeout_ms / 1000 + 5)
    settle(conn, {row[ID]: row for row in rows}, sent)
    refused = [row_id for row_id, _ in sent.rejected]
    return sent, Prepared(ready.messages, ready.failed + refused, ready.aside)
