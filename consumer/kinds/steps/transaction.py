"""One transaction sent as one pipeline: BEGIN and COMMIT travel with the statements.

psycopg's ``conn.transaction()`` inside a pipeline syncs with the server when it opens
and again when it closes, so that its view of the transaction state stays exact: a
transaction of a lock and a few writes took five round trips. Written as statements,
BEGIN goes with the first of them and COMMIT with the last, and the transaction takes
one round trip per result read before it plus one to commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus


@contextmanager
def pipelined_transaction(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Run the block's statements as one transaction in one pipeline.

    Committed when the block ends without an error, rolled back otherwise. A statement's
    error is raised when its result is read: at a ``fetch`` in the block, or at its end.
    A connection that is not idle in autocommit mode gets psycopg's own transaction (a
    savepoint inside one already open).
    """
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        with conn.pipeline(), conn.transaction():
            yield
        return
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            yield
            conn.execute("COMMIT")
    except BaseException:
        # A failed statement leaves the transaction aborted, and an exception in the block
        # leaves it open: either way it ends here. A lost connection has nothing to end.
        if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
            with suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        raise
