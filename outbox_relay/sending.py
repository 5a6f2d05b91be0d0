"""Rows to messages and back: what cannot be sent is marked failed, what Kafka refused too."""

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
from schemas import PayloadSchemas
from schemas.limits import safe_text

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Prepared:
    """Rows made ready: messages to send, ids marked failed, rows whose topic is not there yet."""

    messages: list[Message]
    failed: list[int]
    waiting: list[Row]


def prepare(
    conn: Conn,
    sender: Sender,
    rows: Sequence[Row],
    settings: RelaySettings,
    schemas: PayloadSchemas,
    republish_request: str | None = None,
) -> Prepared:
    """Messages for the sendable rows; rows that can never be sent are marked failed.

    Rows naming a topic the cluster does not have yet are neither: they wait.
    """
    now = orjson.dumps(datetime.now(UTC).isoformat()).decode()
    topics = sender.topics.check(row[TOPIC] for row in rows)
    waiting = [row for row in rows if row[TOPIC] in topics.waiting] if topics.waiting else []
    messages, problems = to_messages(
        [row for row in rows if row[TOPIC] not in topics.waiting] if waiting else rows,
        now,
        schemas=schemas,
        max_bytes=settings.max_message_bytes,
        republish_request=republish_request,
        topic_problems=topics.refused,
        cloudevents=settings.envelope == "cloudevents",
    )
    for row, problem in problems:
        fail(conn, row, problem.reason, str(problem))
    return Prepared(messages, [row[ID] for row, _ in problems], waiting)


def fail(conn: Conn, failed: Row, reason: str, detail: str) -> None:
    """Mark one row failed, count it and say so in the log."""
    row = named(failed)
    store.mark_failed(conn, row.id, safe_text(detail))
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


def settle(conn: Conn, rows: dict[int, Row], sent: Sent) -> None:
    """Mark the rows Kafka refused for good as failed, and count the rest of the outcome."""
    for row_id, reason in sent.rejected:
        fail(conn, rows[row_id], "kafka_rejected", f"Kafka refused the message: {reason}")
    for _, reason in sent.failed:
        metrics.PUBLISH_FAILURES.labels(reason).inc()


def deliver(
    conn: Conn,
    sender: Sender,
    rows: Sequence[Row],
    settings: RelaySettings,
    schemas: PayloadSchemas,
    republish_request: str | None = None,
) -> tuple[Sent, list[int]]:
    """Send rows and wait for Kafka: what it reported, and every row id now marked failed."""
    ready = prepare(conn, sender, rows, settings, schemas, republish_request)
    sent = sender.send(ready.messages, settings.delivery_timeout_ms / 1000 + 5)
    # Not sent, to be tried again: the topic is not there yet.
    sent.failed.extend((row[ID], "topic_not_known_yet") for row in ready.waiting)
    settle(conn, {row[ID]: row for row in rows}, sent)
    return sent, ready.failed + [row_id for row_id, _ in sent.rejected]
