"""The lanes' pool on real PostgreSQL: a connection taken just now is not checked again."""

from __future__ import annotations

import time

import pytest
from psycopg_pool import ConnectionPool

from schemas.runtime import postgres
from tests.conftest import PgSchema


def test_a_connection_taken_just_now_is_taken_again_without_a_round_trip(
    pg_schema: PgSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked when first taken and after RECENT_S idle; not in between."""
    checks: list[int] = []
    real = ConnectionPool.check_connection

    def counted(conn: object) -> None:
        checks.append(1)
        real(conn)  # type: ignore[arg-type]

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    monkeypatch.setattr(postgres, "RECENT_S", 0.5)
    with postgres.pool(pg_schema.url, "inorder-test", 1) as pool:
        for _ in range(3):
            with pool.connection() as conn:
                conn.execute("SELECT 1")
        assert len(checks) == 1  # opened: checked once, then given back and taken at once
        time.sleep(0.6)
        with pool.connection() as conn:
            conn.execute("SELECT 1")
        assert len(checks) == 2


def test_a_connection_that_broke_while_idle_is_replaced_when_taken(
    pg_schema: PgSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its backend ended while it sat in the pool past RECENT_S: the caller gets a live one."""
    monkeypatch.setattr(postgres, "RECENT_S", 0.2)
    with postgres.pool(pg_schema.url, "inorder-test", 1) as pool:
        with pool.connection() as conn:
            pid = conn.info.backend_pid
        with pg_schema.connect(autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.3)
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.info.backend_pid != pid


def test_a_connection_is_given_back_by_the_thread_that_used_it(
    pg_schema: PgSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hand-off to the pool's workers per connection given back: the next taker finds it."""
    tasks: list[str] = []
    real = ConnectionPool.run_task

    def counted(pool: ConnectionPool, task: object) -> None:
        tasks.append(type(task).__name__)
        real(pool, task)  # type: ignore[arg-type]

    monkeypatch.setattr(ConnectionPool, "run_task", counted)
    with postgres.pool(pg_schema.url, "inorder-test", 2) as pool:
        for _ in range(20):
            with pool.connection() as conn:
                conn.execute("SELECT 1")
            assert pool.get_stats()["pool_available"] == 1
    assert "ReturnConnection" not in tasks
