"""The relay's span per delivery: PRODUCER, linked to the context each row was written in.

Made only while tracing is active (``schemas.tracing``); the links carry each row's
entity, seq and transaction id, so a trace viewer can go from the writer's span to
the delivery that published its row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from outbox_relay.rows import ID, MESSAGE_HEADERS, MESSAGE_ROW_ID, MESSAGE_TOPIC, XID, named
from schemas import tracing

if TYPE_CHECKING:
    from outbox_relay.delivery import Delivery


@contextmanager
def traced(delivery: Delivery) -> Iterator[Any]:
    """The delivery's span, current for the block; None when tracing is not active."""
    if not tracing.active():
        yield None
        return
    rows = {row[ID]: row for row in delivery.rows}
    topics = {message[MESSAGE_TOPIC] for message in delivery.messages}
    topic = next(iter(topics)) if len(topics) == 1 else None
    attributes: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.batch.message_count": len(delivery.messages),
    }
    if topic is not None:
        attributes["messaging.destination.name"] = topic
    links = tracing.links(
        (m[MESSAGE_HEADERS], _row_attributes(rows.get(m[MESSAGE_ROW_ID])))
        for m in delivery.messages
    )
    with tracing.span(f"publish {topic or 'outbox'}", "producer", attributes, links) as span:
        yield span


def _row_attributes(row: Any) -> dict[str, Any]:
    # Three per link: the SDK checks every attribute, and a delivery links up to 128 rows.
    if row is None:
        return {}
    found = named(row)
    return {
        "inorder.entity": f"{found.entity_type}:{found.entity_id}",
        "inorder.seq": found.seq,
        "inorder.xid": row[XID],
    }
