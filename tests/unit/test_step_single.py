"""One step's transaction is written once: the same exchanges whichever way it is driven."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from consumer.kinds.steps.plan import Progress
from consumer.kinds.steps.single import Became, Call, Statement, drive, drive_async, one_step
from consumer.kinds.steps.store import StepStore
from schemas import Event

WHEN = "2026-12-05T10:00:00Z"
EVENT = Event("a:5", "ledger.added", "ledger", "a", 1, 5, WHEN, WHEN, {})


class _Route:
    stream = "ledger"


def _store() -> StepStore:
    return StepStore(_Route())  # type: ignore[arg-type]


def test_an_external_step_is_attempted_then_claimed_then_called_then_logged() -> None:
    """Attempt (alone), claim, call, log: four exchanges, and the step applied."""
    exchange = one_step(_store(), Progress(1, 4), EVENT, external=True)
    attempt = next(exchange)
    assert isinstance(attempt, Statement)
    assert (attempt.alone, attempt.rows) == (True, True)
    assert "inorder_step_attempts" in attempt.query[0]
    claim = exchange.send((1,))
    assert isinstance(claim, Statement)
    assert (claim.alone, claim.rows) == (False, True)
    assert "UPDATE inorder_step_progress" in claim.query[0]
    assert exchange.send((1,)) == Call(EVENT)
    logged = exchange.send(None)
    assert isinstance(logged, Statement)
    assert (logged.rows, logged.alone) == (False, False)
    with pytest.raises(StopIteration) as done:
        exchange.send(None)
    assert done.value.value is Became.APPLIED


def test_a_step_someone_else_claimed_is_never_called() -> None:
    """No row back from the claim: the function is not called, nothing is logged."""
    exchange = one_step(_store(), Progress(1, 4), EVENT, external=False)
    claim = next(exchange)
    assert isinstance(claim, Statement)
    assert not claim.alone
    with pytest.raises(StopIteration) as done:
        exchange.send(None)
    assert done.value.value is Became.CLAIMED_ELSEWHERE


@pytest.mark.parametrize(("idempotent", "became"), [(False, None), (True, "call")])
def test_an_unfinished_earlier_call_is_made_again_only_when_idempotent(
    idempotent: bool, became: str | None
) -> None:
    """The attempt found one before it: a call that may have taken effect is not repeated
    (nor is the entity claimed for it)."""
    exchange = one_step(_store(), Progress(1, 4), EVENT, external=True, idempotent=idempotent)
    next(exchange)
    if became is None:
        with pytest.raises(StopIteration) as done:
            exchange.send(None)
        assert done.value.value is Became.UNFINISHED_CALL
    else:
        assert isinstance(exchange.send(None), Statement)  # the claim
        assert exchange.send((1,)) == Call(EVENT)


class _Cursor:
    def __init__(self, row: Any) -> None:
        self.row = row

    def fetchone(self) -> Any:
        return self.row


class _Block:
    """A transaction or a pipeline block, recorded as it opens and closes."""

    def __init__(self, asked: list[str], name: str) -> None:
        self.asked, self.name = asked, name

    def __enter__(self) -> _Block:
        self.asked.append(f"<{self.name}")
        return self

    def __exit__(self, kind: object, *_: object) -> bool:
        self.asked.append(f"{self.name}>")
        return kind is psycopg.Rollback

    async def __aenter__(self) -> _Block:
        return self.__enter__()

    async def __aexit__(self, kind: object, *_: object) -> bool:
        return self.__exit__(kind)


class _Conn:
    """Records what each driver asks of a connection; the claim answers ``claimed``.

    ``autocommit``: idle in autocommit (an attempt commits by itself), or not.
    """

    closed = False

    def __init__(self, claimed: bool, autocommit: bool) -> None:
        self.claimed, self.autocommit = claimed, autocommit
        self.asked: list[str] = []
        self.info = SimpleNamespace(transaction_status=TransactionStatus.IDLE)

    def transaction(self) -> _Block:
        return _Block(self.asked, "tx")

    def execute(self, query: str, params: Any = None) -> _Cursor:
        self.asked.append(query.split(maxsplit=1)[0])
        return _Cursor((1,) if self.claimed and query.startswith(("UPDATE", "INSERT")) else None)


class _AsyncConn(_Conn):
    async def execute(self, query: str, params: Any = None) -> Any:  # type: ignore[override]
        found = _Conn.execute(self, query, params)

        class _Async:
            async def fetchone(self) -> Any:
                return found.row

        return _Async()


class _Handlers:
    def __init__(self, conn: _Conn) -> None:
        self.conn = conn

    def run(self, conn: Any, applies: Mapping[str, Sequence[Event]]) -> None:
        self.conn.asked.append("call")

    async def run_async(self, aconn: Any, event: Event) -> None:
        self.conn.asked.append("call")


# Idle in autocommit the attempt commits by itself; else in a transaction of its own.
ALONE = {True: ["INSERT"], False: ["<tx", "INSERT", "tx>"]}
STEP = {True: ["<tx", "UPDATE", "call", "WITH", "tx>"], False: ["<tx", "UPDATE", "tx>"]}


@pytest.mark.parametrize("autocommit", [True, False])
@pytest.mark.parametrize("claimed", [True, False])
def test_both_drivers_ask_the_same_of_their_connection(claimed: bool, autocommit: bool) -> None:
    """Sync and async, the same statements and the same call, in the same order; the attempt
    committed before the step's transaction begins."""
    sync, aio = _Conn(claimed, autocommit), _AsyncConn(claimed, autocommit)
    step = one_step(_store(), Progress(1, 4), EVENT, external=True)
    a = drive(sync, _Handlers(sync), step)  # type: ignore[arg-type]
    step = one_step(_store(), Progress(1, 4), EVENT, external=True)
    b = asyncio.run(drive_async(aio, _Handlers(aio), step))  # type: ignore[arg-type]
    assert a is b is (Became.APPLIED if claimed else Became.CLAIMED_ELSEWHERE)
    assert sync.asked == aio.asked
    assert sync.asked == ALONE[autocommit] + STEP[claimed]
