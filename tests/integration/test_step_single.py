"""One step in its own transaction on real PostgreSQL, pipelined: what is committed when."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from consumer.kinds.steps.errors import StepFailedError
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.plan import Progress
from consumer.kinds.steps.route import Handler
from consumer.kinds.steps.single import Became, drive, drive_async, one_step
from consumer.kinds.steps.store import StepStore
from schemas import Event
from tests.conftest import PgSchema
from tests.integration import step_handlers
from tests.integration import step_support as ss

EVENT = ss.step(2)


class _Route:
    stream = ss.STREAM
    baseline = False


def _seen(schema: PgSchema) -> tuple[Any, ...]:
    """What another session sees: the attempt's end, the progress and the log of ``a``."""
    with schema.connect(autocommit=True) as other:
        attempt = other.execute(
            "SELECT completed_at IS NOT NULL FROM inorder_step_attempts WHERE entity_id = 'a'"
        ).fetchone()
        last = other.execute(
            "SELECT last_applied FROM inorder_step_progress WHERE entity_id = 'a'"
        ).fetchone()
        logged = other.execute("SELECT count(*) FROM inorder_step_log").fetchone()
    return (attempt, last, logged)


def _handlers(function: Callable[..., Any], *, idempotent: bool = True) -> Handlers:
    handler = Handler("tests:function", external=True, idempotent=idempotent)
    return Handlers({EVENT.event_type: (handler, function)})


@pytest.fixture
def store(pg_schema: PgSchema) -> StepStore:
    ss.prepare(pg_schema)
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied) "
            "VALUES (%s, 'a', 1, 1)",
            (ss.STREAM,),
        )
    return StepStore(_Route())  # type: ignore[arg-type]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_attempt_is_committed_before_the_call_and_the_step_with_its_log_after(
    pg_schema: PgSchema, store: StepStore, driver: str
) -> None:
    """Sent together, the attempt commits on its own before the call; the claim waits for it."""
    during: list[tuple[Any, ...]] = []

    def call(conn: Any, event: Event) -> None:
        during.append(_seen(pg_schema))
        step_handlers.record(conn, event)

    async def call_async(aconn: Any, event: Event) -> None:
        during.append(_seen(pg_schema))
        await step_handlers.slow_call_async(aconn, event)

    exchange = one_step(store, Progress(1, 1), EVENT, external=True)
    if driver == "sync":
        with pg_schema.connect(autocommit=True) as conn:
            became = drive(conn, _handlers(call), exchange)
            assert conn.info.transaction_status == TransactionStatus.IDLE
    else:

        async def run() -> Became:
            async with await psycopg.AsyncConnection.connect(
                pg_schema.url, autocommit=True
            ) as aconn:
                return await drive_async(aconn, _handlers(call_async), exchange)

        became = asyncio.run(run())
    assert became is Became.APPLIED
    assert during == [((False,), (1,), (0,))]  # the attempt made, the step not yet
    assert _seen(pg_schema) == ((True,), (2,), (1,))
    assert ss.applied(pg_schema) == [(1, 2)]


def test_a_function_that_raises_leaves_the_attempt_and_rolls_back_the_claim(
    pg_schema: PgSchema, store: StepStore
) -> None:
    """The call failed: the step is not applied, its attempt stays unfinished for the next try."""

    def call(conn: Any, event: Event) -> None:
        step_handlers.record(conn, event)
        raise ConnectionError("the API answered 503")

    with pg_schema.connect(autocommit=True) as conn:
        with pytest.raises(StepFailedError):
            drive(conn, _handlers(call), one_step(store, Progress(1, 1), EVENT, external=True))
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert _seen(pg_schema) == ((False,), (1,), (0,))
    assert ss.applied(pg_schema) == []


def test_a_statement_of_the_function_that_fails_is_the_steps_failure(
    pg_schema: PgSchema, store: StepStore
) -> None:
    """The function runs outside the pipeline: its own failing statement is its failure."""

    def call(conn: Any, event: Event) -> None:
        conn.execute("INSERT INTO no_such_table VALUES (1)")

    with pg_schema.connect(autocommit=True) as conn:
        with pytest.raises(StepFailedError) as failed:
            drive(conn, _handlers(call), one_step(store, Progress(1, 1), EVENT, external=True))
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert isinstance(failed.value.error, psycopg.errors.UndefinedTable)
    assert _seen(pg_schema)[1:] == ((1,), (0,))


@pytest.mark.parametrize(
    ("start", "earlier", "idempotent", "became"),
    [
        (Progress(1, 0), False, True, Became.CLAIMED_ELSEWHERE),
        (Progress(1, 1), True, False, Became.UNFINISHED_CALL),
        (Progress(1, 1), True, True, Became.APPLIED),
    ],
)
def test_the_function_is_called_only_when_claimed_and_safe_to_call(
    pg_schema: PgSchema,
    store: StepStore,
    start: Progress,
    earlier: bool,
    idempotent: bool,
    became: Became,
) -> None:
    """Moved by someone else, or an earlier call unfinished and not idempotent: no call."""
    calls: list[Event] = []

    def call(conn: Any, event: Event) -> None:
        calls.append(event)

    with pg_schema.connect(autocommit=True) as conn:
        if earlier:
            conn.execute(*store.attempt_query(EVENT))
        step = one_step(store, start, EVENT, external=True, idempotent=idempotent)
        assert drive(conn, _handlers(call, idempotent=idempotent), step) is became
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert len(calls) == (became is Became.APPLIED)
    assert _seen(pg_schema)[1] == ((2,) if became is Became.APPLIED else (1,))


def test_a_connection_lost_during_the_call_leaves_the_attempt_and_applies_nothing(
    pg_schema: PgSchema, store: StepStore
) -> None:
    """The server ends the session mid-step: an outage raised as such, the claim undone by
    the server, the attempt left unfinished for the next try to decide."""

    def call(conn: Any, event: Event) -> None:
        with pg_schema.connect(autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))

    with pg_schema.connect(autocommit=True) as conn, pytest.raises(psycopg.OperationalError):
        drive(conn, _handlers(call), one_step(store, Progress(1, 1), EVENT, external=True))
    assert _seen(pg_schema) == ((False,), (1,), (0,))
    assert ss.applied(pg_schema) == []


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_statements_deallocated_during_the_call_are_prepared_again_in_the_step(
    pg_schema: PgSchema, store: StepStore, driver: str
) -> None:
    """The function deallocates the lane's prepared statements: the closing goes back to its
    savepoint and prepares them again, the step's own writes kept, logged once."""
    with pg_schema.connect(autocommit=True) as conn:  # a step of b first prepares them all
        conn.execute(
            "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied) "
            "VALUES (%s, 'b', 1, 0)",
            (ss.STREAM,),
        )
    warm = ss.step(1, "b")

    def call(conn: Any, event: Event) -> None:
        step_handlers.record(conn, event)
        if event.entity_id == "a":
            conn.execute("DEALLOCATE ALL")

    async def call_async(aconn: Any, event: Event) -> None:
        if event.entity_id == "a":
            await aconn.execute("DEALLOCATE ALL")

    steps = [
        one_step(store, Progress(1, 0), warm, external=True),
        one_step(store, Progress(1, 1), EVENT, external=True),
    ]

    def run() -> None:
        if driver == "sync":
            _drive_sync(pg_schema, call, steps)
        else:
            asyncio.run(_drive_async(pg_schema, call_async, steps))

    run()
    assert _seen(pg_schema) == ((True,), (2,), (2,))  # a: its call finished, at 2; both logged
    assert ss.applied(pg_schema, "a") == ([(1, 2)] if driver == "sync" else [])


def _drive_sync(schema: PgSchema, call: Callable[..., Any], steps: list[Any]) -> None:
    with schema.connect(autocommit=True) as conn:
        try:
            for step in steps:
                assert drive(conn, _handlers(call), step) is Became.APPLIED
        finally:
            assert conn.info.transaction_status == TransactionStatus.IDLE


async def _drive_async(schema: PgSchema, call: Callable[..., Any], steps: list[Any]) -> None:
    async with await psycopg.AsyncConnection.connect(schema.url, autocommit=True) as aconn:
        try:
            for step in steps:
                assert await drive_async(aconn, _handlers(call), step) is Became.APPLIED
        finally:
            assert aconn.info.transaction_status == TransactionStatus.IDLE


def _record_unless_second(calls: list[int], conn: Any, event: Event) -> None:
    """Record in a pipeline of the function's own; at its second call, fail there first."""
    calls.append(event.seq)
    with conn.pipeline():
        if len(calls) == 2:
            conn.execute("SELECT 1 / 0")  # the record's PREPARE after it is skipped
        step_handlers.record(conn, event)


async def _record_unless_second_async(calls: list[int], aconn: Any, event: Event) -> None:
    """``_record_unless_second`` on an async connection."""
    calls.append(event.seq)
    async with aconn.pipeline():
        if len(calls) == 2:
            await aconn.execute("SELECT 1 / 0")
        await step_handlers.record_async(aconn, event)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_statement_the_function_s_failed_pipeline_skipped_runs_in_the_retry(
    pg_schema: PgSchema, store: StepStore, driver: str
) -> None:
    """psycopg listed the function's statement as prepared where the server skipped it, after
    a failure in the function's own pipeline: the step fails once, and its retry and the next
    step run that statement (none fails as never prepared) and apply in order."""
    calls: list[int] = []
    handlers = _handlers(
        functools.partial(
            _record_unless_second if driver == "sync" else _record_unless_second_async, calls
        )
    )
    tries = [(Progress(1, 1), ss.step(2)), (Progress(1, 2), ss.step(3))]
    tries += [tries[1], (Progress(1, 3), ss.step(4))]

    def outcomes(conn: Any) -> list[str]:
        seen = []
        for start, event in tries:
            try:
                became = drive(conn, handlers, one_step(store, start, event, external=True))
                seen.append(became.name)
            except StepFailedError as failed:
                seen.append(type(failed.error).__name__)
        return seen

    async def outcomes_async(aconn: Any) -> list[str]:
        seen = []
        for start, event in tries:
            exchange = one_step(store, start, event, external=True)
            try:
                seen.append((await drive_async(aconn, handlers, exchange)).name)
            except StepFailedError as failed:
                seen.append(type(failed.error).__name__)
        return seen

    async def run_async() -> list[str]:
        async with await psycopg.AsyncConnection.connect(pg_schema.url, autocommit=True) as aconn:
            aconn.prepare_threshold = 1  # psycopg prepares a statement at its second use
            return await outcomes_async(aconn)

    if driver == "sync":
        with pg_schema.connect(autocommit=True) as conn:
            conn.prepare_threshold = 1
            seen = outcomes(conn)
    else:
        seen = asyncio.run(run_async())
    assert seen == ["APPLIED", "DivisionByZero", "APPLIED", "APPLIED"]
    assert ss.applied(pg_schema) == [(1, 2), (1, 3), (1, 4)]
