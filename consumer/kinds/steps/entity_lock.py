"""One consumer at a time runs an entity's one-by-one steps, when consumers share entities.

In a share group several consumers hold one entity's events at the same moment. An
external call is recorded as an attempt before it is made; a second consumer that met
that attempt unfinished could not tell a call in flight from one a crash cut, and would
stop the entity for a person. So while consumers share entities, a consumer runs an
entity's one-by-one steps under a PostgreSQL advisory lock of the session: a second one
waits for the first to finish and then finds those steps done. A crash ends the session
and frees the lock, so an attempt found unfinished after it is one a crash cut.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from consumer.kinds.steps.store import Conn

_LOCK = "SELECT pg_advisory_lock(hashtextextended(%s, 0))"
_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"


def _run(conn: Conn, query: str, key: str) -> None:
    if conn.autocommit:
        conn.execute(query, (key,))
    else:  # its own transaction: the lock is the session's and outlives it
        with conn.transaction():
            conn.execute(query, (key,))


@contextmanager
def entity_held(conn: Conn, route: str, entity_id: str, *, shared: bool) -> Iterator[None]:
    """Hold the entity for this consumer while the block runs (only when ``shared``)."""
    if not shared:
        yield
        return
    key = f"{len(route)}:{route}{entity_id}"  # one key per (route, entity); text has no NUL
    _run(conn, _LOCK, key)
    try:
        yield
    finally:
        if not conn.closed and not conn.broken:
            _run(conn, _UNLOCK, key)
