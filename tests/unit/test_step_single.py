"""One step's transaction is written once: the same exchanges whichever way it is driven."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg.pq import PipelineStatus, TransactionStatus

from consumer.kinds.steps import script, single
from consumer.kinds.steps.plan import Progress
from consumer.kinds.steps.single import (
    Became,
    Call,
    Closing,
    Opening,
    drive,
    drive_async,
    one_step,
    opening,
)
from consumer.kinds.steps.store import StepStore
from schemas import Event

WHEN = "2026-12-05T10:00:00Z"
EVENT = Event("a:5", "ledger.added", "ledger", "a", 1, 5, WHEN, WHEN, {})


class _Route:
    stream = "ledger"


def _store() -> StepStore:
    return StepStore(_Route())  # type: ignore[arg-type]


def test_an_external_step_is_attempted_and_claimed_then_called_then_logged() -> None:
    """Opening (attempt and claim), call, closing (log): three exchanges, and the step applied."""
    exchange = one_step(_store(), Progress(1, 4), EVENT, external=True)
    opening = next(exchange)
    assert isinstance(opening, Opening)
    assert opening.attempt is not None
    assert "inorder_step_attempts" in opening.attempt[0]
    assert "UPDATE inorder_step_progress" in opening.claim[0]
    assert exchange.send(((1,), (1,))) == Call(EVENT)
    closing = exchange.send(None)
    assert isinstance(closing, Closing)
    assert "inorder_step_log" in closing.log[0]
    with pytest.raises(StopIteration) as done:
        exchange.send(None)
    assert done.value.value is Became.APPLIED


def test_a_step_someone_else_claimed_is_never_called() -> None:
    """No row back from the claim: the function is not called, nothing is logged."""
    exchange = one_step(_store(), Progress(1, 4), EVENT, external=False)
    opening = next(exchange)
    assert isinstance(opening, Opening)
    assert opening.attempt is None
    with pytest.raises(StopIteration) as done:
        exchange.send((None, None))
    assert done.value.value is Became.CLAIMED_ELSEWHERE


@pytest.mark.parametrize(("idempotent", "became"), [(False, None), (True, "call")])
def test_an_unfinished_earlier_call_is_made_again_only_when_idempotent(
    idempotent: bool, became: str | None
) -> None:
    """The attempt found one before it: a call that may have taken effect is not repeated
    (and the claim made with the attempt is rolled back)."""
    exchange = one_step(_store(), Progress(1, 4), EVENT, external=True, idempotent=idempotent)
    next(exchange)
    if became is None:
        with pytest.raises(StopIteration) as done:
            exchange.send((None, (1,)))
        assert done.value.value is Became.UNFINISHED_CALL
    else:
        assert exchange.send((None, (1,))) == Call(EVENT)


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
        self.info = SimpleNamespace(
            transaction_status=TransactionStatus.IDLE, pipeline_status=PipelineStatus.OFF
        )

    def script(self, parts: Sequence[Any]) -> list[Any]:
        """A script's parts as the scripted driver sends them; each part's row."""
        rows: list[Any] = []
        for part in parts:
            text = part if isinstance(part, str) else part[0]
            found = _Conn.execute(self, text)
            rows.append(None if isinstance(part, str) else found.row)
        return rows

    def transaction(self) -> _Block:
        return _Block(self.asked, "tx")

    def execute(self, query: str, params: Any = None) -> _Cursor:
        self.asked.append(query.split(maxsplit=1)[0])
        if query in ("BEGIN", "COMMIT", "ROLLBACK"):
            idle = query != "BEGIN"
            self.info.transaction_status = (
                TransactionStatus.IDLE if idle else TransactionStatus.INTRANS
            )
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


# Inside a transaction, one statement at a time: the attempt in a transaction of its own,
# then the step's. Idle in autocommit, two scripts: the attempt committed by itself.
ONE_BY_ONE = {
    True: ["<tx", "INSERT", "tx>", "<tx", "UPDATE", "call", "WITH", "tx>"],
    False: ["<tx", "INSERT", "tx>", "<tx", "UPDATE", "tx>"],
}
# (The call is idempotent: its attempt's commit does not wait for the disk.)
SCRIPTED = {
    True: ["BEGIN", "SET", "INSERT", "COMMIT", "BEGIN", "UPDATE", "call", "WITH", "COMMIT"],
    False: ["BEGIN", "SET", "INSERT", "COMMIT", "BEGIN", "UPDATE", "ROLLBACK"],
}


@pytest.mark.parametrize("autocommit", [True, False])
@pytest.mark.parametrize("claimed", [True, False])
def test_both_drivers_ask_the_same_of_their_connection(
    claimed: bool, autocommit: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sync and async, the same statements and the same call, in the same order; the attempt
    committed before the step's transaction begins, which ends committed or rolled back."""

    async def send_async(aconn: _Conn, parts: Sequence[Any]) -> list[Any]:
        return aconn.script(parts)

    def roll_back(conn: _Conn) -> None:  # the ROLLBACK, recorded as the others
        if conn.info.transaction_status != TransactionStatus.IDLE:
            _Conn.execute(conn, "ROLLBACK")

    async def roll_back_async(aconn: _Conn) -> None:
        roll_back(aconn)

    monkeypatch.setattr(script, "send", lambda conn, parts: conn.script(parts))
    monkeypatch.setattr(script, "send_async", send_async)
    for name in ("roll_back_open", "roll_back_scripts"):
        monkeypatch.setattr(single, name, roll_back)
        monkeypatch.setattr(single, f"{name}_async", roll_back_async)
    sync, aio = _Conn(claimed, autocommit), _AsyncConn(claimed, autocommit)
    step = one_step(_store(), Progress(1, 4), EVENT, external=True)
    a = drive(sync, _Handlers(sync), step)  # type: ignore[arg-type]
    step = one_step(_store(), Progress(1, 4), EVENT, external=True)
    b = asyncio.run(drive_async(aio, _Handlers(aio), step))  # type: ignore[arg-type]
    assert a is b is (Became.APPLIED if claimed else Became.CLAIMED_ELSEWHERE)
    assert sync.asked == aio.asked
    assert sync.asked == (SCRIPTED if autocommit else ONE_BY_ONE)[claimed]
    assert sync.info.transaction_status == TransactionStatus.IDLE


@pytest.mark.parametrize("idempotent", [True, False])
def test_only_a_call_that_is_not_idempotent_waits_for_its_attempt_to_reach_the_disk(
    idempotent: bool,
) -> None:
    """The opening script of an idempotent call commits its attempt unflushed; the replies
    are the attempt's and the claim's rows either way."""
    asked = opening(_store(), Progress(1, 4), EVENT, external=True, idempotent=idempotent)
    parts = asked.parts()
    unflushed = "SET LOCAL synchronous_commit TO off"
    assert (unflushed in parts) is idempotent
    assert parts.index("COMMIT") == (3 if idempotent else 2)
    rows = [("r", i) for i in range(len(parts))]
    assert asked.replies(rows) == (rows[parts.index("COMMIT") - 1], rows[-1])
