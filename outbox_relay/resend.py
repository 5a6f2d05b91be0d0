"""Rows sent ahead of the cursors: listed in ``outbox_resend``, sent once, struck off.

The upgrade lists there the rows it found unpublished (they sort behind every cursor,
with transaction id 0); an operator lists a failed row once corrected, and the rebase
script the unsent rows of a moved outbox. They are claimed in id order, sent, and
struck off in the same transaction; several relays share the work through row locks.
Cursors wait while the list has rows, so each entity's older events still go first.
"""

from __future__ import annotations

from confluent_kafka import KafkaException

from outbox_relay.kafka import Sender
from outbox_relay.rows import COLUMNS, OutboxRow
from outbox_relay.sending import deliver
from outbox_relay.settings import RelaySettings
from outbox_relay.store import Conn
from outbox_relay.weighing import Bounds, unmarked, weighed
from schemas import PayloadSchemas

# The oldest listed rows, as many as the batch size and the read budget allow: rows
# claimed past the budget are left listed, for the next claim.
_LISTED = f"""SELECT {COLUMNS} FROM outbox JOIN outbox_resend USING (id)
 ORDER BY id LIMIT %(limit)s FOR UPDATE OF outbox_resend SKIP LOCKED"""  # noqa: S608 - constants
_CLAIM = weighed(_LISTED, "id", "budget")


def pending(conn: Conn) -> bool:
    """Whether listed rows are still to be sent (by any relay)."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM outbox_resend)").fetchone()
    return bool(row and row[0])


def drain(conn: Conn, sender: Sender, settings: RelaySettings, schemas: PayloadSchemas) -> int:
    """Send one batch of the oldest listed rows; strike off what Kafka took or never will."""
    with conn.transaction():
        params = Bounds.of(settings, settings.read_rows).params()
        claimed, _ = unmarked(conn.execute(_CLAIM, params).fetchall())
        rows = [OutboxRow._make(row) for row in claimed]
        if not rows:
            return 0
        sent, _ = deliver(conn, sender, rows, settings, schemas)
        retry = {row_id for row_id, _ in sent.failed}
        done = [row.id for row in rows if row.id not in retry]
        conn.execute("DELETE FROM outbox_resend WHERE id = ANY(%s)", (done,))
    if sent.failed:
        raise KafkaException(f"{len(sent.failed)} deliveries failed")
    return len(rows)
