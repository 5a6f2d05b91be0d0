"""One step in its own transaction, written once and driven on either kind of connection.

The transaction is a generator of exchanges: it yields what is to be done next (a few
statements sent together, or the step's function), is sent back what came of it, and
returns what became of the step. ``drive`` runs it on a connection, ``drive_async`` on
an async one (an ``async def`` step's lane): the attempt, the claim, the call and the log
are written here once, as psycopg writes each of its exchanges once and drives it both
ways.

Statements sent together travel in one pipeline with the transaction's BEGIN and COMMIT,
so a step whose function calls outside PostgreSQL takes two round trips of its own: the
attempt (committed on its own) with the claim, then the log with the COMMIT. The
function itself runs outside the pipeline, as any code on a connection expects to.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Iterator
from contextlib import AsyncExitStack, ExitStack, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import PipelineStatus, TransactionStatus

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
class Send:
    """Statements sent together; sent back the first row of each that reads one, else None."""

    statements: tuple[Statement, ...]


@dataclass(frozen=True, slots=True)
class Call:
    """Call the step's function on the transaction's connection."""

    event: Event


class Became(enum.Enum):
    """What became of the step: its transaction commits only when it applied."""

    APPLIED = "applied"
    CLAIMED_ELSEWHERE = "claimed_elsewhere"  # another applier moved the entity first
    UNFINISHED_CALL = "unfinished_call"  # an earlier call of this step never finished


Exchange = Generator[Send | Call, Any, Became]


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
    claim = Statement(store.claim_one_query(event.entity_id, start, event), rows=True)
    attempt = Statement(store.attempt_query(event), rows=True, alone=True)
    replies = yield Send((attempt, claim) if external else (claim,))
    if replies[-1] is None:
        return Became.CLAIMED_ELSEWHERE
    if external and replies[0] is None and not idempotent:
        return Became.UNFINISHED_CALL
    yield Call(event)
    yield Send((Statement(store.logged_query(event, called=external)),))
    return Became.APPLIED


class Driven:
    """An exchange as the drivers walk it: each thing asked, the reply set by the driver."""

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange
        # What came of the last thing asked (the rows read), sent back with the next turn.
        self.reply: Any = None
        # What the exchange returned, once it is done.
        self.result = Became.CLAIMED_ELSEWHERE

    def __iter__(self) -> Iterator[Send | Call]:
        while True:
            try:
                asked = self._exchange.send(self.reply)
            except StopIteration as done:
                self.result = done.value
                return
            self.reply = None
            yield asked


def _pipelined(conn: Conn | AsyncConn) -> bool:
    """Whether the driver may send BEGIN and COMMIT itself: autocommit, and idle."""
    return conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


def _ending(result: Became) -> str:
    return "COMMIT" if result is Became.APPLIED else "ROLLBACK"


def _reads(send: Send) -> bool:
    return any(statement.rows for statement in send.statements)


def drive(conn: Conn, handlers: Handlers, exchange: Exchange) -> Became:
    """Run ``exchange`` in one transaction on ``conn``; what became of the step.

    Statements wait in an open pipeline until a row must be read, the function is
    called or the transaction ends; then the pipeline is synced (one round trip).
    """
    if not _pipelined(conn):
        return _drive_plain(conn, handlers, exchange)
    steps = Driven(exchange)
    begun = False
    with ExitStack() as pipeline:
        try:
            for asked in steps:
                if isinstance(asked, Call):
                    pipeline.close()  # sent and answered: the function runs as usual
                    handlers.run(conn, {asked.event.entity_id: [asked.event]})
                    continue
                if pipeline_closed(conn):
                    pipeline.enter_context(conn.pipeline())
                cursors: list[psycopg.Cursor[Any] | None] = []
                for statement in asked.statements:
                    if statement.alone or not begun:
                        conn.execute("BEGIN")
                        begun = begun or not statement.alone
                    cursor = conn.execute(*statement.query)
                    cursors.append(cursor if statement.rows else None)
                    if statement.alone:
                        conn.execute("COMMIT")
                if _reads(asked):
                    pipeline.close()  # synced: every row asked for is here
                steps.reply = [c.fetchone() if c is not None else None for c in cursors]
            if begun:
                if pipeline_closed(conn):
                    pipeline.enter_context(conn.pipeline())
                conn.execute(_ending(steps.result))
            pipeline.close()
        except BaseException:
            with suppress(psycopg.Error):
                pipeline.close()
            # A failed statement leaves the transaction aborted, and an exception anywhere
            # leaves it open: either way it ends here. A lost connection has nothing to end.
            if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
                with suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            raise
    return steps.result


def pipeline_closed(conn: Conn | AsyncConn) -> bool:
    """Whether ``conn`` is outside pipeline mode."""
    return conn.pgconn.pipeline_status == PipelineStatus.OFF


def _drive_plain(conn: Conn, handlers: Handlers, exchange: Exchange) -> Became:
    """``drive`` statement by statement, in psycopg's transactions (a savepoint inside one).

    An attempt is committed in a transaction of its own, before the step's begins.
    """
    steps = Driven(exchange)
    with ExitStack() as stack:
        step: psycopg.Transaction | None = None
        for asked in steps:
            if isinstance(asked, Call):
                handlers.run(conn, {asked.event.entity_id: [asked.event]})
                continue
            rows = []
            for statement in asked.statements:
                if statement.alone:
                    with conn.transaction():
                        rows.append(conn.execute(*statement.query).fetchone())
                    continue
                if step is None:
                    step = stack.enter_context(conn.transaction())
                cursor = conn.execute(*statement.query)
                rows.append(cursor.fetchone() if statement.rows else None)
            steps.reply = rows
        if step is not None and steps.result is not Became.APPLIED:
            raise psycopg.Rollback(step)
    return steps.result


async def drive_async(aconn: AsyncConn, handlers: Handlers, exchange: Exchange) -> Became:
    """Run ``exchange`` in one transaction on the async ``aconn``; what became of the step."""
    if not _pipelined(aconn):
        return await _drive_plain_async(aconn, handlers, exchange)
    steps = Driven(exchange)
    begun = False
    async with AsyncExitStack() as pipeline:
        try:
            for asked in steps:
                if isinstance(asked, Call):
                    await pipeline.aclose()
                    await handlers.run_async(aconn, asked.event)
                    continue
                if pipeline_closed(aconn):
                    await pipeline.enter_async_context(aconn.pipeline())
                cursors: list[psycopg.AsyncCursor[Any] | None] = []
                for statement in asked.statements:
                    if statement.alone or not begun:
                        await aconn.execute("BEGIN")
                        begun = begun or not statement.alone
                    cursor = await aconn.execute(*statement.query)
                    cursors.append(cursor if statement.rows else None)
                    if statement.alone:
                        await aconn.execute("COMMIT")
                if _reads(asked):
                    await pipeline.aclose()
                steps.reply = [await c.fetchone() if c is not None else None for c in cursors]
            if begun:
                if pipeline_closed(aconn):
                    await pipeline.enter_async_context(aconn.pipeline())
                await aconn.execute(_ending(steps.result))
            await pipeline.aclose()
        except BaseException:
            with suppress(psycopg.Error):
                await pipeline.aclose()
            if not aconn.closed and aconn.info.transaction_status != TransactionStatus.IDLE:
                with suppress(psycopg.Error):
                    await aconn.execute("ROLLBACK")
            raise
    return steps.result


async def _drive_plain_async(aconn: AsyncConn, handlers: Handlers, exchange: Exchange) -> Became:
    """``drive_async`` statement by statement, in psycopg's transactions."""
    steps = Driven(exchange)
    async with AsyncExitStack() as stack:
        step: psycopg.AsyncTransaction | None = None
        for asked in steps:
            if isinstance(asked, Call):
                await handlers.run_async(aconn, asked.event)
                continue
            rows = []
            for statement in asked.statements:
                if statement.alone:
                    async with aconn.transaction():
                        rows.append(await (await aconn.execute(*statement.query)).fetchone())
                    continue
                if step is None:
                    step = await stack.enter_async_context(aconn.transaction())
                cursor = await aconn.execute(*statement.query)
                rows.append(await cursor.fetchone() if statement.rows else None)
            steps.reply = rows
        if step is not None and steps.result is not Became.APPLIED:
            raise psycopg.Rollback(step)
    return steps.result
