"""One step in its own transaction, written once and driven on either kind of connection.

The transaction is a generator of exchanges: it yields what is to be done next (a
statement, or the step's function), is sent back what came of it, and returns whether
the step applied. ``drive`` runs it on a connection, ``drive_async`` on an async one
(an ``async def`` step's lane): the claim, the call and the log are written here once,
as psycopg writes each of its exchanges once and drives it both ways.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.lanes import AsyncConn
from consumer.kinds.steps.plan import Progress
from consumer.kinds.steps.store import Conn, Query, StepStore
from schemas import Event


@dataclass(frozen=True, slots=True)
class Statement:
    """Run a statement; sent back its first row (``rows``) or None."""

    query: Query
    rows: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    """Call the step's function on the transaction's connection."""

    event: Event


Exchange = Generator[Statement | Call, Any, bool]


def one_step(store: StepStore, start: Progress, event: Event, *, external: bool) -> Exchange:
    """Claim the entity's progress from ``start`` to ``event``, call the step, log it.

    The claim is one conditional update: should another transaction have moved the row
    meanwhile, nothing is claimed and the step is not called (False).
    """
    claimed = yield Statement(store.claim_one_query(event.entity_id, start, event), rows=True)
    if claimed is None:
        return False
    yield Call(event)
    yield Statement(store.logged_query(event, called=external))
    return True


def drive(conn: Conn, handlers: Handlers, exchange: Exchange) -> bool:
    """Run ``exchange`` in one transaction on ``conn``; what it returned."""
    with conn.transaction():
        reply: Any = None
        while True:
            try:
                asked = exchange.send(reply)
            except StopIteration as done:
                return bool(done.value)
            if isinstance(asked, Call):
                handlers.run(conn, {asked.event.entity_id: [asked.event]})
                reply = None
            else:
                cursor = conn.execute(*asked.query)
                reply = cursor.fetchone() if asked.rows else None


async def drive_async(aconn: AsyncConn, handlers: Handlers, exchange: Exchange) -> bool:
    """Run ``exchange`` in one transaction on the async ``aconn``; what it returned."""
    async with aconn.transaction():
        reply: Any = None
        while True:
            try:
                asked = exchange.send(reply)
            except StopIteration as done:
                return bool(done.value)
            if isinstance(asked, Call):
                await handlers.run_async(aconn, asked.event)
                reply = None
            else:
                cursor = await aconn.execute(*asked.query)
                reply = await cursor.fetchone() if asked.rows else None
