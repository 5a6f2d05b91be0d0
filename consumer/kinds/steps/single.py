"""One step in its own transaction, written once and driven on either kind of connection.

The transaction is a generator of exchanges: it yields what is to be done next (a
statement, or the step's function), is sent back what came of it, and returns whether
the step applied. ``drive`` runs it on a connection, ``drive_async`` on an async one
(an ``async def`` step's lane): the claim, the call and the log are written here once,
as psycopg writes each of its exchanges once and drives it both ways.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
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


class Driven:
    """An exchange as the drivers walk it: each thing asked, the reply set by the driver."""

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange
        # What came of the last thing asked (the claim's row), sent back with the next turn.
        self.reply: Any = None
        # What the exchange returned (whether the step applied), once it is done.
        self.result = False

    def __iter__(self) -> Iterator[Statement | Call]:
        while True:
            try:
                asked = self._exchange.send(self.reply)
            except StopIteration as done:
                self.result = bool(done.value)
                return
            self.reply = None
            yield asked


def drive(conn: Conn, handlers: Handlers, exchange: Exchange) -> bool:
    """Run ``exchange`` in one transaction on ``conn``; what it returned."""
    steps = Driven(exchange)
    with conn.transaction():
        for asked in steps:
            if isinstance(asked, Call):
                handlers.run(conn, {asked.event.entity_id: [asked.event]})
            elif asked.rows:
                steps.reply = conn.execute(*asked.query).fetchone()
            else:
                conn.execute(*asked.query)
    return steps.result


async def drive_async(aconn: AsyncConn, handlers: Handlers, exchange: Exchange) -> bool:
    """Run ``exchange`` in one transaction on the async ``aconn``; what it returned."""
    steps = Driven(exchange)
    async with aconn.transaction():
        for asked in steps:
            if isinstance(asked, Call):
                await handlers.run_async(aconn, asked.event)
            elif asked.rows:
                steps.reply = await (await aconn.execute(*asked.query)).fetchone()
            else:
                await aconn.execute(*asked.query)
    return steps.result
