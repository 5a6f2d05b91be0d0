"""Rows failed for a topic the cluster did not have: sent by themselves once it has it.

A row naming a topic the cluster does not have is failed ``unknown_topic`` once its
grace is over (``INORDER_UNKNOWN_TOPIC_GRACE_S``; with 0, at once, so no slice waits for
a topic) and the cursors pass it. The relays look at such rows at every lease renewal: the
ones whose topic now exists lose their failed mark and are listed to send ahead of the
cursors (``resend``), so they reach Kafka behind later events of their entity, which is
what inorder's consumers are for. A topic that never appears keeps its rows failed, for
an operator to see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from outbox_relay.store import Conn
from outbox_relay.topics import UNKNOWN_TOPIC

REASON = UNKNOWN_TOPIC
# Failed rows are few and indexed (outbox_failed_idx): both statements read only them.
_TOPICS = "SELECT DISTINCT topic FROM outbox WHERE failed_at IS NOT NULL AND failure_reason LIKE %s"
_REVIVE = """
WITH back AS (
    UPDATE outbox SET failed_at = NULL, failure_reason = NULL
     WHERE failed_at IS NOT NULL AND failure_reason LIKE %s AND topic = ANY(%s)
    RETURNING id)
INSERT INTO outbox_resend (id) SELECT id FROM back ON CONFLICT DO NOTHING"""
_PATTERN = f"{REASON}:%"


def revive(conn: Conn, present: Callable[[Iterable[str]], set[str]]) -> int:
    """List for sending the rows failed for a topic that ``present`` now finds; how many."""
    waiting = [row[0] for row in conn.execute(_TOPICS, (_PATTERN,)).fetchall()]
    if not waiting:
        return 0
    found = present(waiting)
    if not found:
        return 0
    with conn.transaction():
        return conn.execute(_REVIVE, (_PATTERN, sorted(found))).rowcount
