"""One step's transaction is written once: the same exchanges whichever way it is driven."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from consumer.kinds.steps.plan import Progress
from consumer.kinds.steps.single import Call, Statement, drive, drive_async, one_step
from consumer.kinds.steps.store import StepStore
from schemas import Event

WHEN = "2026-12-05T10:00:00Z"
EVENT = Event("a:5", "ledger.added", "ledger", "a", 1, 5, WHEN, WHEN, {})


class _Route:
    stream = "ledger"


def _store() -> StepStore:
    return StepStore(_Route())  # type: ignore[arg-type]


def test_a_claimed_step_is_called_then_logged() -> None:
    """Claim (a row back), call, log: three exchanges, and the step applied."""
    exchange = one_step(_store(), Progress(1, 4), EVENT, external=True)
    claim = next(exchange)
    assert isinstance(claim, Statement)
    assert claim.rows
    assert "UPDATE inorder_step_progress" in claim.query[0]
    assert exchange.send((1,)) == Call(EVENT)
    logged = exchange.send(None)
    assert isinstance(logged, Statement)
    assert not logged.rows
    with pytest.raises(StopIteration) as done:
        exchange.send(None)
    assert done.value.value is True


def test_a_step_someone_else_claimed_is_never_called() -> None:
    """No row back from the claim: the function is not called, nothing is logged."""
    exchange = one_step(_store(), Progress(1, 4), EVENT, external=False)
    next(exchange)
    with pytest.raises(StopIteration) as done:
        exchange.send(None)
    assert done.value.value is False


class _Cursor:
    def __init__(self, row: Any) -> None:
        self.row = row

    def fetchone(self) -> Any:
        return self.row


class _Transaction:
    def __enter__(self) -> None: ...
    def __exit__(self, *_: object) -> None: ...
    async def __aenter__(self) -> None: ...
    async def __aexit__(self, *_: object) -> None: ...


class _Conn:
    """Records what each driver asks of a connection; the claim answers ``claimed``."""

    def __init__(self, claimed: bool) -> None:
        self.claimed = claimed
        self.asked: list[str] = []

    def transaction(self) -> _Transaction:
        self.asked.append("begin")
        return _Transaction()

    def execute(self, query: str, params: Any) -> _Cursor:
        self.asked.append(query.split(maxsplit=1)[0])
        return _Cursor((1,) if self.claimed and query.startswith("UPDATE") else None)


class _AsyncConn(_Conn):
    async def execute(self, query: str, params: Any) -> Any:  # type: ignore[override]
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


@pytest.mark.parametrize("claimed", [True, False])
def test_both_drivers_ask_the_same_of_their_connection(claimed: bool) -> None:
    """Sync and async, the same statements and the same call, in the same order."""
    sync, aio = _Conn(claimed), _AsyncConn(claimed)
    a = drive(sync, _Handlers(sync), one_step(_store(), Progress(1, 4), EVENT, external=False))  # type: ignore[arg-type]
    b = asyncio.run(
        drive_async(aio, _Handlers(aio), one_step(_store(), Progress(1, 4), EVENT, external=False))  # type: ignore[arg-type]
    )
    assert a is b is claimed
    assert sync.asked == aio.asked
    assert sync.asked == (["begin", "UPDATE", "call", "INSERT"] if claimed else ["begin", "UPDATE"])
