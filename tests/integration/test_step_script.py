"""Scripts of prepared statements on real PostgreSQL: values bound safely, sessions reset."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from consumer.kinds.steps import script
from consumer.kinds.steps.prepared import PREPARED
from consumer.kinds.steps.rollback import (
    roll_back_open,
    roll_back_open_async,
    roll_back_scripts,
    roll_back_scripts_async,
)
from tests.conftest import PgSchema

INSERT = "INSERT INTO scripted (k, v) VALUES (%(k)s, %(v)s) RETURNING k, v"
# Values a hostile producer could put in an entity id or an event id.
HOSTILE = [
    "a'); DROP TABLE scripted; --",
    "back\\slash",
    "percent %s %(k)s %%",
    "ünï 💥 \u2028",
    "$1; COMMIT",
    "' || (SELECT 1) || '",
]


@pytest.fixture
def conn(pg_schema: PgSchema) -> Iterator[psycopg.Connection]:
    with pg_schema.connect(autocommit=True) as setup:
        setup.execute("CREATE TABLE scripted (k text, v bigint)")
    connection = pg_schema.connect(autocommit=True)
    yield connection
    connection.close()


@pytest.mark.parametrize("value", HOSTILE)
def test_any_value_is_bound_as_a_value(conn: psycopg.Connection, value: str) -> None:
    """Quotes, backslashes, placeholders and SQL in a value are stored as written."""
    rows = script.send(conn, ["BEGIN", (INSERT, {"k": value, "v": 1}), "COMMIT"])
    assert rows == [None, (value, 1), None]
    assert conn.execute("SELECT k FROM scripted").fetchall() == [(value,)]
    assert conn.info.transaction_status == TransactionStatus.IDLE


def test_a_statement_is_prepared_once_per_connection(conn: psycopg.Connection) -> None:
    """The second script runs the statement the first prepared; another session prepares its own."""
    for v in (1, 2):
        script.send(conn, [(INSERT, {"k": "a", "v": v})])
    names = conn.execute(
        "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'inorder_step_%'"
    )
    assert names.fetchone() == (1,)
    assert conn.execute("SELECT v FROM scripted ORDER BY v").fetchall() == [(1,), (2,)]


def test_a_session_that_lost_its_statements_prepares_them_again(
    conn: psycopg.Connection,
) -> None:
    """After DISCARD ALL the script fails once inside, is rolled back, and runs whole again."""
    script.send(conn, ["BEGIN", (INSERT, {"k": "a", "v": 1}), "COMMIT"])
    conn.execute("DISCARD ALL")
    rows = script.send(conn, ["BEGIN", (INSERT, {"k": "b", "v": 2}), "COMMIT"])
    assert rows[1] == ("b", 2)
    assert conn.execute("SELECT k FROM scripted ORDER BY v").fetchall() == [("a",), ("b",)]
    assert conn.info.transaction_status == TransactionStatus.IDLE


def test_a_failing_statement_raises_and_commits_nothing_after_it(
    conn: psycopg.Connection,
) -> None:
    """A script stops at its failing statement: what its transaction did is undone."""
    parts = ["BEGIN", (INSERT, {"k": "a", "v": 1}), ("SELECT 1 / %s", (0,)), "COMMIT"]
    with pytest.raises(psycopg.errors.DivisionByZero):
        script.send(conn, parts)
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT count(*) FROM scripted").fetchone() == (0,)


def test_scripts_answer_right_whatever_came_before_on_the_connection(
    conn: psycopg.Connection,
) -> None:
    """Each script reads its own rows: after a failed one, after the user's own statements."""
    assert script.send(conn, [(INSERT, {"k": "a", "v": 1})]) == [("a", 1)]
    with pytest.raises(psycopg.errors.DivisionByZero):
        script.send(conn, ["BEGIN", ("SELECT 1 / %s", (0,)), "COMMIT"])
    conn.execute("ROLLBACK")
    # The statement that failed was prepared all the same: it is not prepared twice.
    assert script.send(conn, [("SELECT 1 / %s", (1,))]) == [(1,)]
    conn.execute("SELECT 'mine'")  # its result left unread
    assert script.send(conn, ["BEGIN", "COMMIT"]) == [None, None]
    rows = script.send(conn, ["BEGIN", (INSERT, {"k": "b", "v": 2}), ("SELECT 7", ()), "COMMIT"])
    assert rows == [None, ("b", 2), (7,), None]


def test_what_came_of_each_part_up_to_the_one_that_failed(conn: psycopg.Connection) -> None:
    """The parts that ran answer their rows; the failing one its error; the rest nothing."""
    parts = ["BEGIN", (INSERT, {"k": "a", "v": 1}), ("SELECT 1 / %s", (0,)), "COMMIT"]
    done = script.answers(conn, parts)
    assert done.rows == [None, ("a", 1)]
    assert isinstance(done.error, psycopg.errors.DivisionByZero)
    assert conn.info.transaction_status == TransactionStatus.INERROR
    conn.execute("ROLLBACK")


@pytest.mark.parametrize("value", [True, 1.5, b"bytes", ["a"]])
def test_a_value_of_another_kind_is_refused_before_anything_is_sent(
    conn: psycopg.Connection, value: object
) -> None:
    """Only text, integers and None are quoted: anything else is a programming error."""
    with pytest.raises(TypeError, match="text, integers or None"):
        script.send(conn, ["BEGIN", (INSERT, {"k": "a", "v": value}), "COMMIT"])
    assert conn.info.transaction_status == TransactionStatus.IDLE


OTHER = "SELECT count(*) FROM scripted WHERE k = %(k)s"
BROKEN = "SELECT FROM no_such_table WHERE k = %(k)s"


def _ours(conn: psycopg.Connection) -> set[str]:
    """The scripts' statements the session has prepared, as the server says."""
    rows = conn.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'inorder_step_%'")
    return {name for (name,) in rows.fetchall()}


def test_rolling_a_lane_back_keeps_its_statements_whatever_psycopg_prepared(
    conn: psycopg.Connection,
) -> None:
    """A transaction left open by a script and rolled back: psycopg, which prepared a statement
    of its own, does not deallocate the script's with it, and the next script runs at once."""
    conn.execute("SELECT 1", prepare=True)  # psycopg keeps a prepared statement of its own
    script.send(conn, ["BEGIN", (INSERT, {"k": "a", "v": 1})])
    kept = _ours(conn)
    roll_back_scripts(conn)
    conn.execute("SELECT 2", prepare=True)  # psycopg's next statement
    assert _ours(conn) == kept
    assert script.answers(conn, [(INSERT, {"k": "b", "v": 2})]).error is None
    assert conn.execute("SELECT k FROM scripted").fetchall() == [("b",)]


def test_a_session_that_lost_some_statements_prepares_only_those_again(
    conn: psycopg.Connection,
) -> None:
    """One statement deallocated, another still prepared: the script is sent again with the
    lost one's PREPARE only, where preparing both failed on the one the session still had."""
    script.send(conn, [(INSERT, {"k": "a", "v": 1}), (OTHER, {"k": "a"})])
    conn.execute(f"DEALLOCATE {script.prepared(OTHER).name}")
    rows = script.send(conn, [(INSERT, {"k": "b", "v": 2}), (OTHER, {"k": "b"})])
    assert rows == [("b", 2), (1,)]
    assert _ours(conn) == {script.prepared(INSERT).name, script.prepared(OTHER).name}


def test_a_statement_prepared_before_one_that_failed_to_prepare_is_known_prepared(
    conn: psycopg.Connection,
) -> None:
    """A script whose second PREPARE fails: the first one stands, and is not prepared twice."""
    done = script.answers(conn, [(INSERT, {"k": "a", "v": 1}), (BROKEN, {"k": "a"})])
    assert isinstance(done.error, psycopg.errors.UndefinedTable)
    assert done.rows == []
    assert _ours(conn) == {script.prepared(INSERT).name}
    assert script.send(conn, [(INSERT, {"k": "b", "v": 2})]) == [("b", 2)]


def test_async_scripts_keep_their_statements_through_a_rollback_and_a_partial_loss(
    conn: psycopg.Connection, pg_schema: PgSchema
) -> None:
    """The async twin: a rollback keeps the statements; one deallocated is prepared again alone."""

    async def run() -> list[script.Row]:
        aconn = await psycopg.AsyncConnection.connect(pg_schema.conninfo, autocommit=True)
        async with aconn:
            await aconn.execute("SELECT 1", prepare=True)
            await script.send_async(
                aconn, ["BEGIN", (INSERT, {"k": "a", "v": 1}), (OTHER, {"k": "a"})]
            )
            await roll_back_scripts_async(aconn)
            await aconn.execute("SELECT 2", prepare=True)
            await aconn.execute(f"DEALLOCATE {script.prepared(OTHER).name}")
            return await script.send_async(
                aconn, [(INSERT, {"k": "b", "v": 2}), (OTHER, {"k": "b"})]
            )

    assert asyncio.run(run()) == [("b", 2), (1,)]
    assert conn.execute("SELECT k FROM scripted").fetchall() == [("b",)]


def _second_use_after_a_failure(conn: psycopg.Connection) -> None:
    with conn.pipeline():
        conn.execute("SELECT 1 / 0")
        conn.execute("SELECT %s::int", (2,))  # its second use: listed, but skipped


async def _second_use_after_a_failure_async(aconn: psycopg.AsyncConnection) -> None:
    async with aconn.pipeline():
        await aconn.execute("SELECT 1 / 0")
        await aconn.execute("SELECT %s::int", (2,))


def test_a_transaction_a_function_sent_statements_in_rolls_back_through_psycopg(
    conn: psycopg.Connection,
) -> None:
    """psycopg's statement skipped in an aborted pipeline runs after the rollback, and so does
    the script, whose statements psycopg deallocated with its own."""
    script.send(conn, ["BEGIN", (INSERT, {"k": "a", "v": 1})])
    conn.prepare_threshold = 1  # psycopg prepares a statement at its second use
    conn.execute("SELECT %s::int", (1,))
    with pytest.raises(psycopg.errors.DivisionByZero):
        _second_use_after_a_failure(conn)
    roll_back_open(conn)
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert PREPARED.ready(conn) is None  # read from the server before the next script
    assert conn.execute("SELECT %s::int", (3,)).fetchone() == (3,)
    assert script.send(conn, [(INSERT, {"k": "b", "v": 2})]) == [("b", 2)]
    assert conn.execute("SELECT k FROM scripted").fetchall() == [("b",)]


def test_async_a_transaction_a_function_sent_statements_in_rolls_back_through_psycopg(
    conn: psycopg.Connection, pg_schema: PgSchema
) -> None:
    """The async twin: psycopg's statement and the script both run after the rollback."""

    async def run() -> tuple[object, list[script.Row]]:
        aconn = await psycopg.AsyncConnection.connect(pg_schema.conninfo, autocommit=True)
        async with aconn:
            await script.send_async(aconn, ["BEGIN", (INSERT, {"k": "a", "v": 1})])
            aconn.prepare_threshold = 1
            await aconn.execute("SELECT %s::int", (1,))
            with pytest.raises(psycopg.errors.DivisionByZero):
                await _second_use_after_a_failure_async(aconn)
            await roll_back_open_async(aconn)
            again = await (await aconn.execute("SELECT %s::int", (3,))).fetchone()
            return again, await script.send_async(aconn, [(INSERT, {"k": "b", "v": 2})])

    assert asyncio.run(run()) == ((3,), [("b", 2)])
    assert conn.execute("SELECT k FROM scripted").fetchall() == [("b",)]
