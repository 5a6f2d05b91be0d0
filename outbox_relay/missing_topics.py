"""Rows set aside for a topic the cluster did not have: sent by themselves once it has it.

No slice waits for a topic. A row naming one the cluster does not have is set aside at
once (marked ``awaiting_topic``) and the cursors pass it, so the rest of its slice goes
on. The relays look at set-aside rows at every lease renewal: the ones whose topic now
exists lose their mark and are listed to send ahead of the cursors (``resend``), so they
reach Kafka behind later events of their entity, which is what inorder's consumers are
for. One whose topic has not appeared within ``INORDER_UNKNOWN_TOPIC_GRACE_S`` of being
set aside is failed ``unknown_topic``, for an operator to see (the failed-rows alert);
it is still sent by itself if the topic appears later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from outbox_relay.store import Conn
from outbox_relay.topics import AWAITING_LIKE, UNKNOWN_TOPIC

# Set-aside and failed rows are few and indexed (outbox_failed_idx): these read only them.
_REASONS = (AWAITING_LIKE, f"{UNKNOWN_TOPIC}:%")
_TOPICS = """SELECT DISTINCT topic FROM outbox
 WHERE failed_at IS NOT NULL AND (failure_reason LIKE %s OR failure_reason LIKE %s)"""
_REVIVE = """
WITH back AS (
    UPDATE outbox SET failed_at = NULL, failure_reason = NULL
     WHERE failed_at IS NOT NULL AND (failure_reason LIKE %s OR failure_reason LIKE %s)
       AND topic = ANY(%s)
    RETURNING id)
INSERT INTO outbox_resend (id) SELECT id FROM back ON CONFLICT DO NOTHING"""
_GIVE_UP = """
UPDATE outbox SET failed_at = now(), failure_reason = %(unknown)s || ': topic ' || topic
       || ' does not exist in the cluster, or the relay may not describe it (waited '
       || %(grace)s || 's); the row is sent once it does'
 WHERE failed_at IS NOT NULL AND failure_reason LIKE %(aside)s
   AND failed_at < now() - make_interval(secs => %(grace)s) AND NOT (topic = ANY(%(found)s))"""


@dataclass(frozen=True, slots=True)
class Tended:
    """What one look at the set-aside rows did: rows listed to send, rows failed."""

    revived: int = 0
    failed: int = 0


def tend(conn: Conn, present: Callable[[Iterable[str]], set[str]], grace_s: float) -> Tended:
    """List for sending the set-aside or failed rows whose topic ``present`` now finds, and
    fail ``unknown_topic`` those set aside longer than ``grace_s`` whose topic it does not."""
    waiting = [row[0] for row in conn.execute(_TOPICS, _REASONS).fetchall()]
    if not waiting:
        return Tended()
    found = sorted(present(waiting))
    with conn.transaction():
        revived = conn.execute(_REVIVE, (*_REASONS, found)).rowcount if found else 0
        failed = conn.execute(
            _GIVE_UP,
            {"unknown": UNKNOWN_TOPIC, "grace": grace_s, "aside": AWAITING_LIKE, "found": found},
        ).rowcount
    return Tended(revived, failed)
