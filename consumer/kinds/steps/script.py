"""A step's statements sent as one script: one round trip where each statement took one.

An external step commits its attempt on its own, then claims the entity in the step's
transaction, both before its call; after the call it logs the step and commits. One by
one those are six round trips (BEGIN and COMMIT are statements too), and with many lanes
on two cores each round trip is paid twice over, in the consumer and in its server
process, by waking each up. Here the statements before the call go as one simple-query
script (``BEGIN; EXECUTE attempt; COMMIT; BEGIN; EXECUTE claim``) and those after it as
another (``EXECUTE log; COMMIT``): two round trips, and the step's function's own.

Each statement is prepared on the server once per connection, its ``PREPARE`` sent with
the first script that uses it, so the server plans it once as it does psycopg's own
prepared statements; the values are quoted by psycopg (libpq's escaping) into the
``EXECUTE``. Explicit ``BEGIN`` and ``COMMIT`` keep the attempt's commit its own: in a
script, statements before a ``BEGIN`` would join its transaction.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from consumer.kinds.steps.store import Query
from consumer.kinds.steps.transaction import roll_back_open, roll_back_open_async
from schemas.runtime import cursors

# A part of a script: a command without values (BEGIN, COMMIT) or a statement and its values.
Part = str | Query
Row = tuple[Any, ...] | None
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s")


@dataclass(frozen=True, slots=True)
class _Prepared:
    """One statement as the server keeps it: its name, its PREPARE, how values are picked."""

    name: str
    prepare: str
    names: tuple[str, ...]  # for a statement with named placeholders: their order
    count: int  # how many values the EXECUTE passes

    def values(self, params: Any) -> list[Any]:
        """The statement's values in the order of its ``$n``."""
        if self.names:
            return [params[name] for name in self.names]
        return list(params)


@functools.lru_cache(maxsize=64)
def prepared(query: str) -> _Prepared:
    """``query`` (psycopg placeholders, all named or all ``%s``) as a server-side statement."""
    names: list[str] = []
    positional = 0

    def number(found: re.Match[str]) -> str:
        nonlocal positional
        if found.group(1) is None:
            positional += 1
            return f"${positional}"
        if found.group(1) not in names:
            names.append(found.group(1))
        return f"${names.index(found.group(1)) + 1}"

    body = _PLACEHOLDER.sub(number, query)
    if names and positional:
        raise ValueError("a prepared step statement takes named or positional values, not both")
    name = "inorder_step_" + hashlib.sha256(query.encode()).hexdigest()[:16]
    # The body keeps psycopg's ``%%`` for a literal ``%``: the script is bound the same way.
    return _Prepared(name, f"PREPARE {name} AS {body}", tuple(names), len(names) or positional)


def render(parts: Sequence[Part], ready: set[str]) -> tuple[str, list[Any], list[str]]:
    """The script for ``parts``, its values, and the statements it prepares first (pure).

    ``ready``: what the connection has prepared already.
    """
    head: list[str] = []
    body: list[str] = []
    values: list[Any] = []
    fresh: list[str] = []
    for part in parts:
        if isinstance(part, str):
            body.append(part)
            continue
        query, params = part
        statement = prepared(query)
        if statement.name not in ready and statement.name not in fresh:
            head.append(statement.prepare)
            fresh.append(statement.name)
        slots = ", ".join("%s" for _ in range(statement.count))
        body.append(f"EXECUTE {statement.name}({slots})" if slots else f"EXECUTE {statement.name}")
        values += statement.values(params)
    return "; ".join(head + body), values, fresh


class Prepared:
    """Which statements each connection has prepared (forgotten with the connection)."""

    def __init__(self) -> None:
        self._by_conn: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # lanes on threads share this registry

    def ready(self, conn: Any) -> set[str]:
        """The statements ``conn`` has prepared (a copy)."""
        with self._lock:
            return set(self._by_conn.get(conn, ()))

    def add(self, conn: Any, names: Sequence[str]) -> None:
        """Note that ``conn`` prepared ``names``."""
        if names:
            with self._lock:
                self._by_conn.setdefault(conn, set()).update(names)

    def forget(self, conn: Any) -> None:
        """``conn`` lost its prepared statements (its session was reset)."""
        with self._lock:
            self._by_conn.pop(conn, None)


PREPARED = Prepared()


def _results(cursor: Any, prepares: int, parts: Sequence[Part]) -> Iterator[bool]:
    """Move ``cursor`` to each part's result in turn, past the PREPAREs; yield whether the
    part has a row to read there (a command, or a statement without rows, has none)."""
    for _ in range(prepares):
        cursor.nextset()
    for index, part in enumerate(parts):
        if index:
            cursor.nextset()
        yield not isinstance(part, str) and cursor.description is not None


def send(conn: psycopg.Connection[Any], parts: Sequence[Part]) -> list[Row]:
    """Run ``parts`` as one script on ``conn`` (idle, autocommit); each part's first row.

    A session that lost its prepared statements (someone ran ``DISCARD ALL`` on it) fails
    at its first ``EXECUTE``, before anything committed: its transaction is rolled back
    and the script sent again with every ``PREPARE``. (Were only a later statement lost,
    the attempt would be found made by this very try: a step that is not idempotent then
    waits for a person, the safe side.)
    """
    for last in (False, True):
        text, values, fresh = render(parts, PREPARED.ready(conn))
        cursor: psycopg.ClientCursor[Any] = cursors.kept(conn, psycopg.ClientCursor)
        try:
            cursor.execute(text, values)
        except psycopg.errors.InvalidSqlStatementName:
            PREPARED.forget(conn)
            roll_back_open(conn)
            if last:
                raise
            continue
        PREPARED.add(conn, fresh)
        return [cursor.fetchone() if has else None for has in _results(cursor, len(fresh), parts)]
    raise AssertionError("unreachable")


async def send_async(aconn: psycopg.AsyncConnection[Any], parts: Sequence[Part]) -> list[Row]:
    """``send`` on an async connection."""
    for last in (False, True):
        text, values, fresh = render(parts, PREPARED.ready(aconn))
        cursor: psycopg.AsyncClientCursor[Any] = cursors.kept(aconn, psycopg.AsyncClientCursor)
        try:
            await cursor.execute(text, values)
        except psycopg.errors.InvalidSqlStatementName:
            PREPARED.forget(aconn)
            await roll_back_open_async(aconn)
            if last:
                raise
            continue
        PREPARED.add(aconn, fresh)
        results = _results(cursor, len(fresh), parts)
        return [await cursor.fetchone() if has else None for has in results]
    raise AssertionError("unreachable")
