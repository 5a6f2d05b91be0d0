"""Publishing: read past the cursors, send, and advance the cursors once Kafka has everything.

One write per delivery, none per row. Reads run ahead of sending, each from where the
delivery before it will leave the cursors: while one delivery is in flight, the next one's
messages are made here and PostgreSQL finds the rows of the one after. The read ahead
when a call's time is up is the next call's first (while a backlog lasts, no read keeps
this thread waiting from its start; measured: 9 % more rows/s). A delivery is sent
only after the one before it was acknowledged and its cursors stored, so a failure
never lets a later delivery pass an earlier one, and a crash re-sends at most the delivery in
hand: the stored cursors are behind it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter

import orjson
import structlog
from confluent_kafka import KafkaException

from outbox_relay import metrics, store
from outbox_relay.delivery import Delivery
from outbox_relay.frontier import Cursor, advance
from outbox_relay.kafka import Sender
from outbox_relay.reading import Reader
from outbox_relay.rows import ID, MESSAGE_ROW_ID, OCCURRED_AT, XID
from outbox_relay.sending import prepare, settle
from outbox_relay.settings import RelaySettings
from outbox_relay.store import Conn, Read
from outbox_relay.tracing import traced
from outbox_relay.weighing import Bounds
from schemas import PayloadSchemas, tracing

log = structlog.get_logger(__name__)

_ID, _XID, _OCCURRED_AT = itemgetter(ID), itemgetter(XID), itemgetter(OCCURRED_AT)


@dataclass(slots=True)
class Published:
    """What one call to ``publish`` did."""

    rows: int = 0
    full: bool = False  # the last delivery filled a slice: more is waiting


class Publisher:
    """Publishes the slices a relay owns (``owned``: slice -> stored cursor)."""

    def __init__(
        self,
        conn: Conn,
        reader: Reader,
        sender: Sender,
        settings: RelaySettings,
        schemas: PayloadSchemas,
        owner: str,
    ) -> None:
        self.conn = conn
        self.reader = reader
        self.sender = sender
        self.settings = settings
        self.schemas = schemas
        self.owner = owner
        self.bounds = Bounds.of(settings, settings.read_rows)

    def publish(
        self, owned: dict[int, Cursor], budget_s: float, stopping: Callable[[], bool]
    ) -> Published:
        """Send deliveries until a read finds nothing or ``budget_s`` is spent.

        ``owned`` is updated as cursors are stored; a slice whose lease was lost is
        dropped from it. Raises ``KafkaException`` when a delivery failed: the slices
        concerned keep their cursors and are read again.
        """
        outcome = Published()
        deadline = time.monotonic() + budget_s
        bounds = self.bounds

        def read_after(delivery: Delivery) -> bool:
            # A delivery that filled no slice took everything there was: the next rows come
            # with their NOTIFY, so reading again at once would only find nothing. A read
            # started here is taken by this call or, past the deadline, by the next one.
            if not delivery.full or stopping():
                return False
            self.reader.ahead(self._still_owned(delivery, owned), bounds)
            return True

        delivery = self._delivery(owned, self.reader.take(owned, bounds))
        self._prepare(delivery)
        more = read_after(delivery)
        while delivery.rows and owned:
            if len(owned) < len(delivery.cursors):  # a slice was lost: send none of its rows
                lost = {row_id for row_id, s in delivery.slice_of().items() if s not in owned}
                delivery.messages = [m for m in delivery.messages if m[MESSAGE_ROW_ID] not in lost]
            with traced(delivery) as span:
                self.sender.produce(delivery.messages)
                ahead = None
                if more and time.monotonic() < deadline:
                    # While Kafka takes this delivery: the next one's rows, the read after it
                    # started at once (PostgreSQL works on it meanwhile), the next messages.
                    cursors = self._still_owned(delivery, owned)
                    ahead = self._delivery(cursors, self.reader.take(cursors, bounds))
                    more = read_after(ahead)
                    self._prepare(ahead)
                self._settle(delivery, owned, outcome)
                if span is not None and delivery.oldest is not None:
                    span.set_attribute("inorder.outbox.oldest_age_s", time.time() - delivery.oldest)
            if ahead is None:
                break
            delivery = ahead
        if not delivery.rows:
            self._forget_finished(delivery, owned)
        return outcome

    def _forget_finished(self, delivery: Delivery, owned: dict[int, Cursor]) -> None:
        """Store cursors that an empty read changed (remembered transactions that finished)."""
        changed = {s: c for s, c in delivery.cursors.items() if s in owned and c != owned[s]}
        if changed:
            stored = store.save_cursors(self.conn, self.owner, changed, self.settings.lease_s)
            owned.update({s: c for s, c in changed.items() if s in stored})

    @staticmethod
    def _still_owned(delivery: Delivery, owned: dict[int, Cursor]) -> dict[int, Cursor]:
        return {s: c for s, c in delivery.cursors.items() if s in owned}

    def _delivery(self, cursors: dict[int, Cursor], found: Read) -> Delivery:
        """The delivery a read past ``cursors`` makes: its rows and new cursors."""
        limit = self.settings.read_rows
        delivery = Delivery(dict(cursors))
        for slice_, cursor in cursors.items():
            rows = found.rows.get(slice_, [])[:limit]
            taken = list(zip(map(_XID, rows), map(_ID, rows), strict=True))
            cut = len(rows) >= limit or slice_ in found.cut
            delivery.cursors[slice_] = advance(cursor, found.snapshot, taken, cut)
            delivery.full = delivery.full or cut
            # Write order: an entity's rows in seq order even where transaction ids are
            # not. All of an entity's rows are in one slice, so each slice is sorted alone.
            rows.sort(key=_ID)
            delivery.rows += rows
        if not delivery.rows:
            return delivery
        # One session time zone renders every timestamp alike: the least text is the oldest.
        oldest = min(map(_OCCURRED_AT, delivery.rows))
        delivery.oldest = datetime.fromisoformat(orjson.loads(oldest)).timestamp()
        return delivery

    def _prepare(self, delivery: Delivery) -> None:
        """The delivery's messages; rows that cannot be sent now are marked failed or set aside."""
        if delivery.rows:
            ready = prepare(self.conn, self.sender, delivery.rows, self.settings, self.schemas)
            delivery.messages = ready.messages

    def _settle(self, delivery: Delivery, owned: dict[int, Cursor], outcome: Published) -> None:
        sent = self.sender.wait(self.settings.delivery_timeout_ms / 1000 + 5)
        if sent.rejected or sent.failed:
            settle(self.conn, {row[ID]: row for row in delivery.rows}, sent)
        slice_of = delivery.slice_of() if sent.failed else {}
        retry = {slice_of[row_id] for row_id, _ in sent.failed}
        # Only cursors that moved are written: every write leaves a row version that a long
        # transaction elsewhere keeps vacuum from removing.
        done = {
            s: c
            for s, c in delivery.cursors.items()
            if s in owned and s not in retry and c != owned[s]
        }
        lease_s = self.settings.lease_s
        stored = store.save_cursors(self.conn, self.owner, done, lease_s) if done else set()
        for slice_, cursor in done.items():
            if slice_ in stored:
                owned[slice_] = cursor
            else:
                del owned[slice_]
                log.warning("slice_lost", slice=slice_, reason="lease taken by another relay")
        delivered = len(delivery.messages) - len(sent.missing())
        metrics.PUBLISHED.inc(delivered)
        if delivery.oldest is not None and delivered:
            metrics.PUBLISH_LATENCY.observe(
                max(0.0, time.time() - delivery.oldest), exemplar=tracing.current_exemplar()
            )
        outcome.full = delivery.full
        outcome.rows += delivered
        if sent.failed:
            log.warning(
                "kafka_delivery_failed",
                rows=len(sent.failed),
                reason=sent.failed[0][1],
                published=delivered,
            )
            raise KafkaException(f"{len(sent.failed)} deliveries failed")
