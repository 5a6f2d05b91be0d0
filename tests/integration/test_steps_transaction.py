"""The step route's pipelined transaction on real PostgreSQL: commit, and each way to end it."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from consumer.kinds.steps.transaction import pipelined_transaction
from tests.conftest import PgSchema


class _BlockError(Exception):
    pass


@pytest.fixture
def conn(pg_schema: PgSchema) -> Iterator[psycopg.Connection]:
    with pg_schema.connect(autocommit=True) as c:
        c.execute("CREATE TABLE t (n int PRIMARY KEY)")
        yield c


def _rows(conn: psycopg.Connection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT n FROM t ORDER BY n").fetchall()]


def _insert_twice(conn: psycopg.Connection) -> None:
    with pipelined_transaction(conn):
        conn.execute("INSERT INTO t VALUES (2)")
        conn.execute("INSERT INTO t VALUES (1)")


def _raise_after_a_read(conn: psycopg.Connection) -> None:
    with pipelined_transaction(conn):
        conn.execute("INSERT INTO t VALUES (2)")
        conn.execute("SELECT 1").fetchone()
        raise _BlockError


def _lose_the_session(conn: psycopg.Connection, pg_schema: PgSchema) -> None:
    with pipelined_transaction(conn):
        conn.execute("INSERT INTO t VALUES (2)")
        with pg_schema.connect(autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        conn.execute("SELECT 1").fetchone()


def test_statements_commit_together_and_results_read_inside(conn: psycopg.Connection) -> None:
    """Rows written before and after a read in the block are committed, and the read sees them."""
    with pipelined_transaction(conn):
        conn.execute("INSERT INTO t VALUES (1)")
        seen = conn.execute("SELECT count(*) FROM t").fetchone()
        conn.execute("INSERT INTO t VALUES (2)")
    assert seen == (1,)
    assert _rows(conn) == [1, 2]
    assert conn.info.transaction_status == TransactionStatus.IDLE


def test_a_failing_statement_rolls_back_the_statements_before_it(
    conn: psycopg.Connection,
) -> None:
    """A duplicate key after a good insert raises; neither row stays; the connection is idle."""
    conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(psycopg.errors.UniqueViolation):
        _insert_twice(conn)
    assert _rows(conn) == [1]
    assert conn.info.transaction_status == TransactionStatus.IDLE


def test_an_exception_in_the_block_rolls_back(conn: psycopg.Connection) -> None:
    """An error raised by Python code in the block ends the transaction without commit."""
    with pytest.raises(_BlockError):
        _raise_after_a_read(conn)
    assert _rows(conn) == []
    assert conn.info.transaction_status == TransactionStatus.IDLE


def test_inside_an_open_transaction_it_is_a_savepoint(conn: psycopg.Connection) -> None:
    """Opened within a transaction, a failure undoes only its own statements."""
    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            _insert_twice(conn)
    assert _rows(conn) == [1]


def test_a_lost_connection_raises_what_happened(
    conn: psycopg.Connection, pg_schema: PgSchema
) -> None:
    """The server ending the session mid-block raises OperationalError; nothing is committed."""
    with pytest.raises(psycopg.OperationalError):
        _lose_the_session(conn, pg_schema)
    with pg_schema.connect() as other:
        assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)


def _fail_before_a_first_use(conn: psycopg.Connection) -> None:
    with pipelined_transaction(conn):
        conn.execute("INSERT INTO t VALUES (1)")  # a duplicate: the pipeline is aborted here
        conn.execute("INSERT INTO t VALUES (%s)", (5,))  # its PREPARE is skipped


@pytest.mark.parametrize("failed_before", [0, 2])
def test_a_statement_skipped_in_a_failed_pipeline_is_prepared_when_next_used(
    conn: psycopg.Connection, failed_before: int
) -> None:
    """A statement whose PREPARE the server skipped, after a failure earlier in the same
    pipeline, runs in the next transaction instead of failing as never prepared."""
    conn.prepare_threshold = 1  # psycopg prepares a statement at its second use
    with pipelined_transaction(conn):
        conn.execute("INSERT INTO t VALUES (%s)", (1,))  # its first use
    for _ in range(failed_before):  # psycopg heeds a ROLLBACK it runs only the first time
        with pytest.raises(psycopg.errors.UniqueViolation):
            _insert_twice(conn)
    with pytest.raises(psycopg.errors.UniqueViolation):
        _fail_before_a_first_use(conn)
    with pipelined_transaction(conn):
        conn.execute("INSERT INTO t VALUES (%s)", (3,))
    assert _rows(conn) == [1, 3]
