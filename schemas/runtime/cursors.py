"""A cursor kept on a connection, for statements a program sends on it again and again.

``conn.execute`` makes a new cursor for every statement, and with it psycopg looks up
again how to send each parameter and read each column: about 15 µs of CPU a statement,
a tenth of an ``emit`` in a transaction. A cursor of each kind is kept on the
connection itself (it goes with the connection), made again should it be closed.

Every execute holds the connection's lock, so tasks and threads sharing a connection
may share a cursor whose results nobody reads (the outbox writers').
"""

from __future__ import annotations

from typing import Any, TypeVar

Cursor = TypeVar("Cursor")


def kept(conn: Any, kind: type[Cursor]) -> Cursor:
    """The cursor of ``kind`` kept on ``conn``, made on first use (or once closed)."""
    name = f"_inorder_{kind.__name__}"
    cur = getattr(conn, name, None)
    if cur is None or cur.closed:
        cur = kind(conn)  # type: ignore[call-arg]  # every psycopg cursor takes its connection
        setattr(conn, name, cur)
    return cur
