"""One consumer at a time runs an entity's one-by-one steps, when consumers share entities.

In a share group several consumers hold one entity's events at the same moment. An
external call is recorded as an attempt before it is made; a second consumer that met
that attempt unfinished could not tell a call in flight from one a crash cut, and would
stop the entity for a person. So while consumers share entities, a consumer runs an
entity's one-by-one steps under a PostgreSQL advisory lock of the session. A consumer
that finds the entity held does not wait (a hung call would hold every member up): it
parks the events, and the holder drains them once its run is over. A crash ends the
session and frees the lock, so an attempt found unfinished after it is one a crash cut.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from consumer.kinds.steps.store import Conn

_LOCK = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))"
_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"


def _run(conn: Conn, query: str, key: str) -> bool:
    if conn.autocommit:
        row = conn.execute(query, (key,)).fetchone()
    else:  # its own transaction: the lock is the session's and outlives it
        with conn.transaction():
            row = conn.execute(query, (key,)).fetchone()
    return bool(row and row[0])


@contextmanager
def entity_held(conn: Conn, route: str, entity_id: str, *, shared: bool) -> Iterator[bool]:
    """Hold the entity for this consumer while the block runs (only when ``shared``);
    False: another consumer holds it now."""
    if not shared:
        yield True
        return
    key = f"{len(route)}:{route}{entity_id}"  # one key per (route, entity); text has no NUL
    if not _run(conn, _LOCK, key):
        yield False
        return
    try:
        yield True
    finally:
        if not conn.closed and not conn.broken:
            _run(conn, _UNLOCK, key)
