"""One step in its own transaction, written once and driven on either kind of connection.

The transaction is a generator of exchanges: it yields what is to be done next (the
opening statements, the step's function, the closing statement), is sent back what came
of it, and returns what became of the step. ``drive`` runs it on a connection,
``drive_async`` on an async one (an ``async def`` step's lane): the attempt, the claim,
the call and the log are written here once, as psycopg writes each of its exchanges once
and drives it both ways.

On a connection idle in autocommit (a lane's), the opening and the closing each go as
one script (``script``): the step takes two round trips besides its function's own,
where statement by statement it took six. Inside a transaction already open (a
savepoint then holds the step) they go one by one.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Iterator, Sequence
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
from psycopg.pq import PipelineStatus, TransactionStatus

from consumer.kinds.steps import script
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.lanes import AsyncConn
from consumer.kinds.steps.plan import Plan, Progress
from consumer.kinds.steps.rollback import (
    roll_back_open,
    roll_back_open_async,
    roll_back_scripts,
    roll_back_scripts_async,
)
from consumer.kinds.steps.script import Part, Row
from consumer.kinds.steps.store import Conn, Query, StepStore
from schemas import Event

# An idempotent call's attempt is committed without waiting for the disk (``Opening``).
_UNFLUSHED = "SET LOCAL synchronous_commit TO off"


@dataclass(frozen=True, slots=True)
class Opening:
    """Before the call: ``attempt`` (an external call's) committed on its own, then ``claim``
    in the step's transaction. Sent back: the first row of each (None without one).

    ``flushed``: whether the attempt's commit, sent as a script, waits for the disk. Only
    a call that is not idempotent needs it to outlive a crash (found unfinished, it is
    not made again); an idempotent one lost with a crash is made again, as it would be
    were its attempt found unfinished. It is visible to other sessions at once either
    way, and the step's own commit, later in the same log, flushes it.
    """

    attempt: Query | None
    claim: Query
    flushed: bool = True

    def parts(self) -> list[Part]:
        """The opening as a script: the attempt committed on its own, then the claim."""
        if self.attempt is None:
            return ["BEGIN", self.claim]
        unflushed = [] if self.flushed else [_UNFLUSHED]
        return ["BEGIN", *unflushed, self.attempt, "COMMIT", "BEGIN", self.claim]

    def replies(self, rows: Sequence[Row]) -> Replies:
        """The attempt's row and the claim's, out of the rows of ``parts``."""
        if self.attempt is None:
            return None, rows[-1]
        return rows[1 if self.flushed else 2], rows[-1]


@dataclass(frozen=True, slots=True)
class Closing:
    """After the call: log the step, in its transaction, and commit it."""

    log: Query


@dataclass(frozen=True, slots=True)
class Call:
    """Call the step's function on the transaction's connection."""

    event: Event


class Became(enum.Enum):
    """What became of the step: its transaction commits only when it applied."""

    APPLIED = "applied"
    CLAIMED_ELSEWHERE = "claimed_elsewhere"  # another applier moved the entity first
    UNFINISHED_CALL = "unfinished_call"  # an earlier call of this step never finished


Asked = Opening | Call | Closing
Exchange = Generator[Asked, Any, Became]
# What an opening answers: the attempt's first row (None: none, or no attempt), the claim's.
Replies = tuple[Row, Row]


def opening(
    store: StepStore,
    start: Progress,
    event: Event,
    *,
    external: bool,
    idempotent: bool = True,
    guessed: bool = False,
) -> Opening:
    """The statements before ``event``'s call, from ``start``: its attempt and its claim.

    ``guessed``: ``start`` was not read; the attempt, as the claim, is made only there.
    """
    attempt = store.attempt_query(event, start if guessed else None) if external else None
    claim = store.claim_one_query(event.entity_id, start, event)
    return Opening(attempt, claim, flushed=not idempotent)


@dataclass(slots=True)
class Chain:
    """The next step's opening, sent with this step's closing should this step apply.

    ``replies`` is set when it was: the connection is then in the next step's
    transaction, its attempt committed and its claim made, and that step is driven with
    them (``answered``). A next opening that failed is rolled back and not set: that
    step sends its own.
    """

    opening: Opening
    replies: Replies | None = None


def next_opening(
    store: StepStore, handlers: Handlers, after: Progress, upcoming: Plan | None, *, awaited: bool
) -> Chain | None:
    """The opening of ``upcoming``'s first step (the plan once the step before applied, from
    ``after``), to send with that step's closing when both are driven alike: ``awaited``
    on the loop's async connection, else on the lane's own. None: it opens itself."""
    if upcoming is None or not upcoming.apply or handlers.awaited(upcoming.apply[0]) != awaited:
        return None
    nxt = upcoming.apply[0]
    external, idempotent = handlers.external(nxt), handlers.idempotent(nxt)
    return Chain(opening(store, after, nxt, external=external, idempotent=idempotent))


@dataclass(frozen=True, slots=True)
class Carried:
    """What a step's closing and opening carry: ``answered``, this step's opening as the
    previous closing sent it; ``chain``, the next step's, to send with this closing."""

    answered: Replies | None = None
    chain: Chain | None = None


ALONE = Carried()


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
    fresh, claimed = yield opening(store, start, event, external=external, idempotent=idempotent)
    if external and fresh is None and not idempotent:
        return Became.UNFINISHED_CALL  # the claim, made with it, is rolled back
    if claimed is None:
        return Became.CLAIMED_ELSEWHERE
    yield Call(event)
    yield Closing(store.logged_query(event, called=external))
    return Became.APPLIED


class Driven:
    """An exchange as the drivers walk it: each thing asked, the reply set by the driver."""

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange
        # What came of the last thing asked (the row read), sent back with the next turn.
        self.reply: Any = None
        # What the exchange returned, once it is done.
        self.result = Became.CLAIMED_ELSEWHERE

    def __iter__(self) -> Iterator[Asked]:
        while True:
            try:
                asked = self._exchange.send(self.reply)
            except StopIteration as done:
                self.result = done.value
                return
            self.reply = None
            yield asked


def scripted(conn: Conn | AsyncConn) -> bool:
    """Whether the step's statements may go as scripts: idle in autocommit, no pipeline."""
    return (
        conn.autocommit
        and conn.info.transaction_status == TransactionStatus.IDLE
        and conn.info.pipeline_status == PipelineStatus.OFF
    )


def _alone(conn: Conn) -> AbstractContextManager[Any]:
    """Where a statement commits on its own: by itself in autocommit, else in a transaction."""
    idle = conn.info.transaction_status == TransactionStatus.IDLE
    return nullcontext() if conn.autocommit and idle else conn.transaction()


def drive(
    conn: Conn,
    handlers: Handlers,
    exchange: Exchange,
    carried: Carried = ALONE,
) -> Became:
    """Run ``exchange`` in one transaction on ``conn`` (a savepoint inside one already
    open); what became of the step.

    An attempt is committed on its own before the step's transaction begins. On a
    connection idle in autocommit, ``carried.chain`` sends the next step's opening with
    this step's closing, and ``carried.answered`` is this step's opening as an earlier
    closing sent it (the connection in its transaction).
    """
    if carried.answered is not None or scripted(conn):
        return _drive_scripted(conn, handlers, exchange, carried)
    steps = Driven(exchange)
    with ExitStack() as stack:
        step: psycopg.Transaction | None = None
        for asked in steps:
            if isinstance(asked, Call):
                handlers.run(conn, {asked.event.entity_id: [asked.event]})
            elif isinstance(asked, Opening):
                fresh = None
                if asked.attempt is not None:
                    with _alone(conn):
                        fresh = conn.execute(*asked.attempt).fetchone()
                step = stack.enter_context(conn.transaction())
                steps.reply = (fresh, conn.execute(*asked.claim).fetchone())
            else:
                conn.execute(*asked.log)
        if step is not None and steps.result is not Became.APPLIED:
            raise psycopg.Rollback(step)
    return steps.result


def _drive_scripted(
    conn: Conn,
    handlers: Handlers,
    exchange: Exchange,
    carried: Carried = ALONE,
) -> Became:
    """``drive`` on a connection idle in autocommit: the opening and the closing as scripts.

    The transaction the opening begins ends here whatever happens: committed by the
    closing, else rolled back (a step not applied, a function that raised, an error),
    by psycopg once the function sent statements in it (``rollback``). Only the next
    step's transaction, once its chained opening answered, stays open.
    """
    steps = Driven(exchange)
    chain = carried.chain
    called = False
    try:
        for asked in steps:
            if isinstance(asked, Call):
                called = True
                handlers.run(conn, {asked.event.entity_id: [asked.event]})
            elif isinstance(asked, Opening):
                if carried.answered is not None:  # sent with the previous step's closing
                    steps.reply = carried.answered
                else:
                    rows = script.send(conn, asked.parts())
                    steps.reply = asked.replies(rows)
            else:
                _close(conn, asked, chain)
    finally:
        if chain is None or chain.replies is None:
            (roll_back_open if called else roll_back_scripts)(conn)
    return steps.result


def _close(conn: Conn, asked: Closing, chain: Chain | None) -> None:
    """Log and commit the step; with ``chain``, the next step's opening in the same script.

    Should the script fail before this step's ``COMMIT`` answered, the step did not
    commit: the error is raised. Should it fail after (in the next step's opening), the
    step stands, and the next one, rolled back, sends its own opening again.
    """
    if chain is None:
        script.send(conn, [asked.log, "COMMIT"])
        return
    nxt = chain.opening
    _chained_replies(chain, script.answers(conn, [asked.log, "COMMIT", *nxt.parts()]))


def _chained_replies(chain: Chain, done: script.Answers) -> None:
    """What a closing script with ``chain``'s opening answered: the opening's replies set,
    or, failed, the closing's error raised unless its ``COMMIT`` answered."""
    if done.error is None:
        chain.replies = chain.opening.replies(done.rows[2:])
    elif len(done.rows) < 2:
        raise done.error


def _alone_async(aconn: AsyncConn) -> AbstractAsyncContextManager[Any]:
    idle = aconn.info.transaction_status == TransactionStatus.IDLE
    return nullcontext() if aconn.autocommit and idle else aconn.transaction()


async def drive_async(
    aconn: AsyncConn, handlers: Handlers, exchange: Exchange, carried: Carried = ALONE
) -> Became:
    """``drive`` on the async ``aconn``: the same statements and call, in the same order."""
    if carried.answered is not None or scripted(aconn):
        return await _drive_scripted_async(aconn, handlers, exchange, carried)
    steps = Driven(exchange)
    async with AsyncExitStack() as stack:
        step: psycopg.AsyncTransaction | None = None
        for asked in steps:
            if isinstance(asked, Call):
                await handlers.run_async(aconn, asked.event)
            elif isinstance(asked, Opening):
                fresh = None
                if asked.attempt is not None:
                    async with _alone_async(aconn):
                        fresh = await (await aconn.execute(*asked.attempt)).fetchone()
                step = await stack.enter_async_context(aconn.transaction())
                steps.reply = (fresh, await (await aconn.execute(*asked.claim)).fetchone())
            else:
                await aconn.execute(*asked.log)
        if step is not None and steps.result is not Became.APPLIED:
            raise psycopg.Rollback(step)
    return steps.result


async def _drive_scripted_async(
    aconn: AsyncConn, handlers: Handlers, exchange: Exchange, carried: Carried = ALONE
) -> Became:
    """``_drive_scripted`` on the async ``aconn``."""
    steps = Driven(exchange)
    chain = carried.chain
    called = False
    try:
        for asked in steps:
            if isinstance(asked, Call):
                called = True
                await handlers.run_async(aconn, asked.event)
            elif isinstance(asked, Opening):
                if carried.answered is not None:  # sent with the previous step's closing
                    steps.reply = carried.answered
                else:
                    rows = await script.send_async(aconn, asked.parts())
                    steps.reply = asked.replies(rows)
            else:
                await _close_async(aconn, asked, chain)
    finally:
        if chain is None or chain.replies is None:
            await (roll_back_open_async if called else roll_back_scripts_async)(aconn)
    return steps.result


async def _close_async(aconn: AsyncConn, asked: Closing, chain: Chain | None) -> None:
    """``_close`` on the async ``aconn``."""
    if chain is None:
        await script.send_async(aconn, [asked.log, "COMMIT"])
        return
    nxt = chain.opening
    _chained_replies(chain, await script.answers_async(aconn, [asked.log, "COMMIT", *nxt.parts()]))
