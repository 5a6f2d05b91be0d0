"""One step in its own transaction, written once and driven on either kind of connection.

The transaction is a generator of exchanges: it yields what is to be done next (a
statement, or the step's function), is sent back what came of it, and returns what
became of the step. ``drive`` runs it on a connection, ``drive_async`` on
an async one (an ``async def`` step's lane): the attempt, the claim, the call and the log
are written here once, as psycopg writes each of its exchanges once and drives it both
ways.

Statements are sent one by one. (Sent in one pipeline with BEGIN and COMMIT, a step
took two round trips where it takes six, but cost more CPU in the driver: with many
lanes on two cores, the steps per second fell by a fifth to a third.)
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    AsyncExitStack,
    ExitStack,
    nullcontext,
)
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.lanes import AsyncConn
from consumer.kinds.steps.plan import Progress
from consumer.kinds.steps.store import Conn, Query, StepStore
from schemas import Event


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement; ``rows``: its first row is sent back. ``alone``: committed on its own,
    before the step's transaction begins (an external call's attempt)."""

    query: Query
    rows: bool = False
    alone: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    """Call the step's function on the transaction's connection."""

    event: Event


class Became(enum.Enum):
    """What became of the step: its transaction commits only when it applied."""

    APPLIED = "applied"
    CLAIMED_ELSEWHERE = "claimed_elsewhere"  # another applier moved the entity first
    UNFINISHED_CALL = "unfinished_call"  # an earlier call of this step never finished


Exchange = Generator[Statement | Call, Any, Became]


def one_step(
    store: StepStore, start: Progress, event: Event, *, external: bool, idempotent: bool = True
) -> Exchange:
    """Record the call's attempt (``external``), claim the entity's progress from ``start``
    to ``event``, call the step, log it.

    The attempt is committed before the call, so a call that may have taken effect is
    known after a crash: found unfinished, a step that is not ``idempotent`` is not
    called again (``UNFINISHED_CALL``). The claim is one conditional update: should
    another transaction have moved the row meanwhile, nothing is claimed and the step is
    not called.
    """
    if external:
        fresh = yield Statement(store.attempt_query(event), rows=True, alone=True)
        if fresh is None and not idempotent:
            return Became.UNFINISHED_CALL
    claimed = yield Statement(store.claim_one_query(event.entity_id, start, event), rows=True)
    if claimed is None:
        return Became.CLAIMED_ELSEWHERE
    yield Call(event)
    yield Statement(store.logged_query(event, called=external))
    return Became.APPLIED


class Driven:
    """An exchange as the drivers walk it: each thing asked, the reply set by the driver."""

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange
        # What came of the last thing asked (the row read), sent back with the next turn.
        self.reply: Any = None
        # What the exchange returned, once it is done.
        self.result = Became.CLAIMED_ELSEWHERE

    def __iter__(self) -> Iterator[Statement | Call]:
        while True:
            try:
                asked = self._exchange.send(self.reply)
            except StopIteration as done:
                self.result = done.value
                return
            self.reply = None
            yield asked


def _alone(conn: Conn) -> AbstractContextManager[Any]:
    """Where a statement commits on its own: by itself in autocommit, else in a transaction."""
    idle = conn.info.transaction_status == TransactionStatus.IDLE
    return nullcontext() if conn.autocommit and idle else conn.transaction()


def drive(conn: Conn, handlers: Handlers, exchange: Exchange) -> Became:
    """Run ``exchange`` in one transaction on ``conn`` (a savepoint inside one already
    open); what became of the step.

    An attempt is committed on its own before the step's transaction begins.
    """
    steps = Driven(exchange)
    with ExitStack() as stack:
        step: psycopg.Transaction | None = None
        for asked in steps:
            if isinstance(asked, Call):
                handlers.run(conn, {asked.event.entity_id: [asked.event]})
                continue
            if asked.alone:
                with _alone(conn):
                    steps.reply = conn.execute(*asked.query).fetchone()
                continue
            if step is None:
                step = stack.enter_context(conn.transaction())
            cursor = conn.execute(*asked.query)
            steps.reply = cursor.fetchone() if asked.rows else None
        if step is not None and steps.result is not Became.APPLIED:
            raise psycopg.Rollback(step)
    return steps.result


def _alone_async(aconn: AsyncConn) -> AbstractAsyncContextManager[Any]:
    idle = aconn.info.transaction_status == TransactionStatus.IDLE
    return nullcontext() if aconn.autocommit and idle else aconn.transaction()


async def drive_async(aconn: AsyncConn, handlers: Handlers, exchange: Exchange) -> Became:
    """``drive`` on the async ``aconn``: the same statements and call, in the same order."""
    steps = Driven(exchange)
    async with AsyncExitStack() as stack:
        step: psycopg.AsyncTransaction | None = None
        for asked in steps:
            if isinstance(asked, Call):
                await handlers.run_async(aconn, asked.event)
                continue
            if asked.alone:
                async with _alone_async(aconn):
                    steps.reply = await (await aconn.execute(*asked.query)).fetchone()
                continue
            if step is None:
                step = await stack.enter_async_context(aconn.transaction())
            cursor = await aconn.execute(*asked.query)
            steps.reply = await cursor.fetchone() if asked.rows else None
        if step is not None and steps.result is not Became.APPLIED:
            raise psycopg.Rollback(step)
    return steps.result
