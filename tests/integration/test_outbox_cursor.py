"""The cursor a connection's outbox writes go through: kept on it, shared, made again when it must.

``emit`` writes through one cursor per connection (``cursors.kept``) instead of a new one a
statement. These tests hold it to what a new cursor a statement gave: every row written
whatever shares the connection, a failed statement harming nothing after it, a closed
cursor or a changed cursor factory honoured, a pipeline's results kept apart.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest

from producer import DuplicateEventError, OutboxEvent, emit, emit_async, emit_many, emit_many_async
from schemas.runtime import cursors
from tests.conftest import PgSchema

PAYLOAD = {"plan": "pro", "price_cents": 2900, "status": "active"}


def _event(entity: str, seq: int = 1) -> OutboxEvent:
    return OutboxEvent("subscription", entity, seq, "subscription.plan_changed", PAYLOAD)


def _written(schema: PgSchema) -> list[tuple[str, int]]:
    with schema.connect() as conn:
        rows = conn.execute("SELECT entity_id, seq FROM outbox ORDER BY id").fetchall()
    return [(entity, seq) for entity, seq in rows]


def test_threads_sharing_a_connection_write_every_event(outbox: PgSchema) -> None:
    """Eight threads emitting at once on one connection's transaction write all their rows."""
    failures: list[BaseException] = []
    with outbox.connect() as conn, conn.transaction():
        start = threading.Barrier(8)

        def write(thread: int) -> None:
            try:
                start.wait()
                for seq in range(1, 51):
                    emit(conn, _event(f"t{thread}", seq))
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                failures.append(exc)

        threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []
    written = _written(outbox)
    assert sorted(written) == sorted((f"t{n}", s) for n in range(8) for s in range(1, 51))
    for n in range(8):  # each thread's own rows in the order it wrote them
        assert [s for e, s in written if e == f"t{n}"] == list(range(1, 51))


def test_an_emit_waits_for_a_statement_another_thread_has_under_way(outbox: PgSchema) -> None:
    """While another thread's statement runs on the connection, emit waits, then writes."""
    with outbox.connect() as conn, conn.transaction():
        started = threading.Event()

        def slow() -> None:
            started.set()
            conn.execute("SELECT pg_sleep(0.3)")

        other = threading.Thread(target=slow)
        other.start()
        started.wait()
        time.sleep(0.1)  # the other statement is under way: the state reads ACTIVE
        emit(conn, _event("a", 1))
        other.join()
    assert _written(outbox) == [("a", 1)]


def test_a_refused_write_leaves_the_next_transaction_whole(outbox: PgSchema) -> None:
    """After a duplicate is refused and rolled back, the same connection writes on unharmed."""
    with outbox.connect() as conn:
        with conn.transaction():
            emit(conn, _event("a", 1))
        with pytest.raises(DuplicateEventError), conn.transaction():
            emit_many(conn, [_event("b", 1), _event("a", 1)])
        with conn.transaction():
            emit(conn, _event("a", 2))
            emit_many(conn, [_event("c", 1), _event("c", 2)])
    assert _written(outbox) == [("a", 1), ("a", 2), ("c", 1), ("c", 2)]


def test_a_cursor_closed_behind_its_back_is_made_again(outbox: PgSchema) -> None:
    """Closing the kept cursor (as code walking a connection's cursors might) costs no write."""
    with outbox.connect() as conn:
        with conn.transaction():
            emit(conn, _event("a", 1))
        cursors.kept(conn, conn.cursor_factory).close()
        with conn.transaction():
            emit(conn, _event("a", 2))
    assert _written(outbox) == [("a", 1), ("a", 2)]


def test_a_changed_cursor_factory_is_what_writes(outbox: PgSchema) -> None:
    """A connection switched to client-side binding sends its writes with the values bound."""
    with outbox.connect() as conn, outbox.connect(autocommit=True) as watcher:

        def last_statement() -> str:
            row = watcher.execute(
                "SELECT query FROM pg_stat_activity WHERE pid = %s", (conn.info.backend_pid,)
            ).fetchone()
            assert row is not None
            return str(row[0])

        with conn.transaction():
            emit(conn, _event("server-bound", 1))
            assert "server-bound" not in last_statement()
        conn.cursor_factory = psycopg.ClientCursor
        with conn.transaction():
            emit(conn, _event("client-bound", 1))
            assert "client-bound" in last_statement()
    assert _written(outbox) == [("server-bound", 1), ("client-bound", 1)]


def _write_twice_in_a_pipeline(conn: psycopg.Connection[Any]) -> None:
    with conn.pipeline(), conn.transaction():
        emit(conn, _event("a", 1))
        conn.execute("SELECT 1").fetchall()


def test_in_a_pipeline_each_write_reads_its_own_result(outbox: PgSchema) -> None:
    """In a pipeline the user's own results stay theirs and a duplicate is still refused."""
    with outbox.connect() as conn:
        with conn.pipeline(), conn.transaction():
            mine = conn.execute("SELECT 41 + 1")
            emit(conn, _event("a", 1))
            emit_many(conn, [_event("b", 1), _event("b", 2)])
            assert mine.fetchone() == (42,)
        with pytest.raises((DuplicateEventError, psycopg.errors.UniqueViolation)):
            _write_twice_in_a_pipeline(conn)
    assert _written(outbox) == [("a", 1), ("b", 1), ("b", 2)]


def test_an_async_emit_waits_for_a_statement_another_task_has_under_way(
    outbox: PgSchema,
) -> None:
    """While another task's statement runs on the connection, emit_async waits, then writes."""

    async def main() -> None:
        conn = await psycopg.AsyncConnection.connect(outbox.url)
        async with conn, conn.transaction():
            slow = asyncio.create_task(conn.execute("SELECT pg_sleep(0.3)"))
            await asyncio.sleep(0.1)
            await emit_async(conn, _event("a", 1))
            await slow

    asyncio.run(main())
    assert _written(outbox) == [("a", 1)]


def test_tasks_sharing_an_async_connection_write_every_event(outbox: PgSchema) -> None:
    """Eight tasks emitting at once on one async connection's transaction write all their rows."""

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(outbox.url) as conn:
            async with conn.transaction():

                async def write(task: int) -> None:
                    for seq in range(1, 26):
                        if seq % 5:
                            await emit_async(conn, _event(f"t{task}", seq))
                        else:  # a batch of one now and then, through the same cursor
                            await emit_many_async(conn, [_event(f"t{task}", seq)])

                await asyncio.gather(*(write(n) for n in range(8)))
            await cursors.kept(conn, conn.cursor_factory).close()
            async with conn.transaction():
                await emit_async(conn, _event("after", 1))

    asyncio.run(main())
    written = _written(outbox)
    assert len(written) == 8 * 25 + 1
    for n in range(8):
        assert [s for e, s in written if e == f"t{n}"] == list(range(1, 26))
    assert written[-1] == ("after", 1)
