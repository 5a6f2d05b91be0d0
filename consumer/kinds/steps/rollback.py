"""Ending a step's open transaction, and what its session keeps prepared through the end.

The server keeps a session's prepared statements through a rollback; psycopg does not
keep its list of them: its own ``rollback()`` forgets the list and deallocates every
statement on the session, the scripts' too. It has to: in a pipeline, a statement is
listed as prepared when its ``PREPARE`` is sent, and an earlier statement's failure in
the same pipeline makes the server skip that ``PREPARE``. Rolled back behind psycopg's
back, the list would keep the name, and the statement would fail as never prepared in
every later transaction on the connection.

So a transaction in which psycopg sent statements (a step function's, a pipelined
batch's) is rolled back by psycopg (``roll_back_open``), and the scripts' registry then
reads again what the server still has. A transaction of scripts alone (an opening
guessed wrong, one carried but not driven, a script that failed from idle) is rolled
back through libpq (``roll_back_scripts``): psycopg's list did not change in it, and
nothing is deallocated.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import psycopg
from psycopg import generators
from psycopg.pq import TransactionStatus

from consumer.kinds.steps.prepared import PREPARED

Conn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]


def _open(conn: Conn | AsyncConn) -> bool:
    """Whether ``conn`` is left in a transaction (a lost connection has none to end)."""
    return not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE


def roll_back_open(conn: Conn) -> None:
    """End the transaction ``conn`` was left in, if any, by psycopg: a failed statement
    leaves it aborted, an exception between statements leaves it open."""
    if not _open(conn):
        return
    PREPARED.forget(conn)
    with suppress(psycopg.Error):
        conn.rollback()


def roll_back_scripts(conn: Conn) -> None:
    """``roll_back_open`` for a transaction in which only scripts ran: through libpq."""
    if not _open(conn):
        return
    with suppress(psycopg.Error):
        back_to(conn, b"ROLLBACK")


def back_to(conn: Conn, rollback: bytes) -> None:
    """Send ``rollback`` (``ROLLBACK``, or to a savepoint) through libpq."""
    with conn.lock:
        conn.pgconn.send_query(rollback)
        conn.wait(generators.execute(conn.pgconn))


async def roll_back_open_async(aconn: AsyncConn) -> None:
    """``roll_back_open`` on an async connection."""
    if not _open(aconn):
        return
    PREPARED.forget(aconn)
    with suppress(psycopg.Error):
        await aconn.rollback()


async def roll_back_scripts_async(aconn: AsyncConn) -> None:
    """``roll_back_scripts`` on an async connection."""
    if not _open(aconn):
        return
    with suppress(psycopg.Error):
        await back_to_async(aconn, b"ROLLBACK")


async def back_to_async(aconn: AsyncConn, rollback: bytes) -> None:
    """``back_to`` on an async connection."""
    async with aconn.lock:
        aconn.pgconn.send_query(rollback)
        await aconn.wait(generators.execute(aconn.pgconn))
