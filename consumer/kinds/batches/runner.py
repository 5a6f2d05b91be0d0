"""A batch route at work: load under the locks, decide over the share, write once.

Everything of one poll batch happens in one PostgreSQL transaction, under the touched
batches' locks: read (``incoming``), load (``store.load``), decide (``plan.Share``),
read the rows of batches that finish, finish (``Share.finish``), write (``store.write``
and the outputs, the ``batch.assembled`` revisions and re-dispatched work items, to the
consumer's own outbox), so a decision and its output commit together or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
import structlog

from consumer.kinds._base import Applier, Conn
from consumer.kinds._outcome import Outcome, Refusal
from consumer.kinds._resources import Resources
from consumer.kinds.batches.errors import BATCH_REJECTED
from consumer.kinds.batches.incoming import Incoming, read
from consumer.kinds.batches.plan import Share
from consumer.kinds.batches.route import BatchRoute
from consumer.kinds.batches.store import BatchStore
from schemas import Event
from schemas.batches import BatchStatus
from schemas.codec import encode
from schemas.limits import safe_text
from schemas.outbox import emit_many
from schemas.runtime.causes import Cause, cause
from schemas.runtime.logs import first_line
from schemas.runtime.payloads import default_payload_schemas

if TYPE_CHECKING:
    from consumer.settings import RouteSettings

log = structlog.get_logger(__name__)


class BatchRunner:
    """The batch routes of one consumer, sweeper or inorder-admin."""

    def __init__(self, routes: Sequence[BatchRoute]) -> None:
        self.routes = {r.stream: r for r in routes}
        self.stores = {r.stream: BatchStore(r.stream) for r in routes}
        self._schemas = default_payload_schemas()

    def process(
        self, conn: psycopg.Connection[Any], stream: str, events: Sequence[Event]
    ) -> tuple[Incoming, Share]:
        """Apply a route's share of one poll batch, in one transaction.

        A result that comes before its batch's manifest is kept as an inorder envelope
        (whatever envelope it came in), which is what its dead letter carries if the
        manifest never comes.
        """
        route, store = self.routes[stream], self.stores[stream]
        incoming = read(route, events, self._schemas)
        envelopes: dict[int, bytes] = {}

        def envelope(event: Event) -> bytes:
            """The event's envelope, encoded once however often it is asked for."""
            if id(event) not in envelopes:
                envelopes[id(event)] = encode(event)
            return envelopes[id(event)]

        with conn.transaction():
            snapshot = store.load(
                conn,
                incoming.batch_ids,
                incoming.keys,
                take_early=[m.batch_id for m in incoming.manifests],
            )
            early = any(r.batch_id not in snapshot.batches for r, _ in incoming.results)
            share = Share(route, snapshot)
            held = store.early_held(conn) if early else (0, 0)
            share.take(incoming, held, lambda event: len(envelope(event)))
            self.write(conn, share, envelope)
        return incoming, share

    def write(
        self,
        conn: psycopg.Connection[Any],
        share: Share,
        envelope: Callable[[Event], bytes] = encode,
    ) -> None:
        """Finish what the share decided and write it all; the batches' locks must be held.

        ``envelope``: what a result kept early is stored as (its encoded event).
        """
        store = self.stores[share.route.stream]
        unread = share.unread
        share.finish(store.rows_of(conn, unread) if unread else {})
        store.write(
            conn,
            created=share.created,
            items=share.items,
            early=[
                (r.batch_id, e.event_id, r.attempt, e.event_type, dict(e.payload), envelope(e))
                for r, e in share.kept
            ],
            statuses=share.statuses,
        )
        if share.outputs:
            emit_many(conn, share.outputs, schemas=self._schemas)
        for note in share.notes:
            getattr(log, note.level)(note.event, **note.fields)

    def expire(self, conn: psycopg.Connection[Any], stream: str, limit: int) -> list[Share]:
        """Past their deadline, waiting batches stop waiting: pending positions are abandoned.

        Behind a barrier, as the consumer's apply is: when the overdue batches fail
        together for a reason one of them holds, each is expired alone, and one that
        still fails is stopped, inconsistent with the error, so it is not met again.
        """
        overdue = self.stores[stream].overdue(conn, limit)
        try:
            return [self._expire(conn, stream, overdue)]
        except Exception as exc:
            if cause(exc) is not Cause.INPUT or not overdue:
                raise
        return [self._expire_alone(conn, stream, batch_id) for batch_id in overdue]

    def _expire(self, conn: psycopg.Connection[Any], stream: str, overdue: list[str]) -> Share:
        store = self.stores[stream]
        with conn.transaction():
            store.lock(conn, overdue)
            abandoned = store.abandon_pending(conn, overdue) if overdue else 0
            share = Share(self.routes[stream], store.load(conn, overdue))
            share.results["abandoned"] += abandoned
            waiting = [b for b in overdue if share.batches[b].status == BatchStatus.WAITING]
            share.settle(waiting, reason="deadline passed")
            self.write(conn, share)
        return share

    def _expire_alone(self, conn: psycopg.Connection[Any], stream: str, batch_id: str) -> Share:
        try:
            return self._expire(conn, stream, [batch_id])
        except Exception as exc:
            if cause(exc) is not Cause.INPUT:
                raise
            why = f"expiry failed: {type(exc).__name__}: {first_line(exc)}"[:500]
        store = self.stores[stream]
        with conn.transaction():
            store.lock(conn, [batch_id])
            share = Share(self.routes[stream], store.load(conn, [batch_id]))
            share.stop(batch_id, safe_text(why))
            self.write(conn, share)
        return share


class BatchApplier(Applier[BatchRoute]):
    """One batch route in the consumer: its share of a poll batch in one transaction."""

    def __init__(self, route: BatchRoute) -> None:
        self.route = route
        self.runner = BatchRunner([route])

    def connect(self, links: Resources[RouteSettings]) -> None:
        """Nothing to check: the batch tables and the outbox come with the migrations."""

    def apply(self, conn: Conn, events: Sequence[Event], raw: Mapping[Event, bytes]) -> Outcome:
        """Store manifests, apply results, decide and assemble; refused events are named."""
        incoming, share = self.runner.process(conn, self.route.stream, events)
        # Every other event was taken into its batch's state (a repeated answer changes
        # nothing, which is the point): counted applied like any route's; the route's
        # own output read back is stale.
        refused = [*incoming.refused, *share.refused]
        aside = {id(event) for event, _ in refused} | {id(e) for e in incoming.ignored}
        outcome = share.outcome()
        outcome.applied = [event for event in events if id(event) not in aside]
        outcome.stale = list(incoming.ignored)
        outcome.refused = [Refusal(e, BATCH_REJECTED, why) for e, why in refused]
        return outcome
