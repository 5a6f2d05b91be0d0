"""One transaction sent as one pipeline: BEGIN and COMMIT travel with the statements.

psycopg's ``conn.transaction()`` inside a pipeline syncs with the server when it opens
and again when it closes, so that its view of the transaction state stays exact: a
transaction of a lock and a few writes took five round trips. Written as statements,
BEGIN goes with the first of them and COMMIT with the last: two round trips when one
result is read on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from consumer.kinds.steps.rollback import roll_back_open

Sync = Callable[[], None]


def _no_sync() -> None:
    """Nothing to sync: statements outside a pipeline are answered one by one."""


@contextmanager
def pipelined_transaction(conn: psycopg.Connection[Any]) -> Iterator[Sync]:
    """Run the block's statements as one transaction in one pipeline; yields ``sync``.

    Committed when the block ends without an error, rolled back otherwise. A statement's
    error is raised when its result is read: at a sync or a fetch in the block, or at its
    end. Call ``sync`` before the block's first fetch, in its place: the fetch then costs
    no round trip of its own, and from then on libpq knows a transaction is open. Before
    any sync it only knows the state of the server's last answer to one, idle, and code
    that asks (psycopg's own ``transaction()`` in a step function, ``emit``) would take
    the open transaction for none. A connection that is not idle in autocommit mode gets
    psycopg's own transaction (a savepoint inside one already open).
    """
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        with conn.pipeline() as pipeline, conn.transaction():
            yield pipeline.sync
        return
    try:
        with conn.pipeline() as pipeline:
            conn.execute("BEGIN")
            yield pipeline.sync
            conn.execute("COMMIT")
    except BaseException:
        roll_back_open(conn)
        raise


@contextmanager
def plain_transaction(conn: psycopg.Connection[Any]) -> Iterator[Sync]:
    """psycopg's transaction, statement by statement, with the same ``sync`` (a no-op)."""
    with conn.transaction():
        yield _no_sync
