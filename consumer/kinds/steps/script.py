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
prepared statements; the values are quoted into the ``EXECUTE`` by libpq's escaping
(``PQescapeLiteral``). Explicit ``BEGIN`` and ``COMMIT`` keep the attempt's commit its
own: in a script, statements before a ``BEGIN`` would join its transaction.

A script goes through libpq's calls as psycopg makes them (``send_query``, then its
generator that reads every result), not through a cursor: a cursor binds the values
with psycopg's adapters and walks its results one by one, which took a third of the
consumer's CPU for a step. The server answers each statement that ran, up to the first
that failed, so what came of each part is known (``answers``).

A script sent inside a transaction (a step's closing, after its function) begins with a
savepoint: should the function have deallocated the statements (psycopg does, after
a rollback to a savepoint of the function's own), the script goes back to it and is
sent again with their ``PREPARE``, the step's work kept (``after``).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors, generators, pq
from psycopg.adapt import Transformer

from consumer.kinds.steps.errors import StatementsLostError
from consumer.kinds.steps.prepared import PREPARED
from consumer.kinds.steps.rollback import (
    back_to,
    back_to_async,
    roll_back_scripts,
    roll_back_scripts_async,
)
from consumer.kinds.steps.store import Query

# A part of a script: a command without values (BEGIN, COMMIT) or a statement and its values.
Part = str | Query
Row = tuple[Any, ...] | None
_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)s|%s")
LOST = "a lane's prepared statements were deallocated inside a step's transaction"
# A script sent inside a transaction begins with a savepoint, to come back to should its
# statements be found lost there (``after``).
_SAVEPOINT = "SAVEPOINT inorder_script"
_BACK = b"ROLLBACK TO SAVEPOINT inorder_script"
# What the session has prepared of the scripts' statements, read again once some were lost
# (the rest are not prepared twice).
_SERVER_HAS = r"SELECT name FROM pg_prepared_statements WHERE name LIKE 'inorder\_step\_%'"
# Quotes one value as an SQL literal (``quoter``).
Quote = Callable[[Any], str]


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
        if found.group(0) == "%%":  # psycopg's literal ``%``: the server reads it as is
            return "%"
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
    return _Prepared(name, f"PREPARE {name} AS {body}", tuple(names), len(names) or positional)


def render(parts: Sequence[Part], ready: set[str], quote: Quote) -> tuple[str, list[str]]:
    """The script for ``parts``, values quoted in, and the statements it prepares first (pure).

    ``ready``: what the connection has prepared already.
    """
    head: list[str] = []
    body: list[str] = []
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
        values = ", ".join(quote(value) for value in statement.values(params))
        body.append(f"EXECUTE {statement.name}" + (f"({values})" if values else ""))
    return "; ".join(head + body), fresh


def quoter(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Quote:
    """Quote values for ``conn`` (its encoding, libpq's escaping): text, integers and None,
    the only kinds a step's statements carry."""
    escape = pq.Escaping(conn.pgconn).escape_literal
    encoding = conn.info.encoding

    def quote(value: Any) -> str:
        if value is None:
            return "NULL"
        if type(value) is int:
            return str(value)
        if isinstance(value, str):
            return escape(value.encode(encoding)).decode(encoding)
        raise TypeError(f"a step's statement takes text, integers or None, not {type(value)}")

    return quote


@dataclass(frozen=True, slots=True)
class Answers:
    """What came of a script's parts: the first row of each that ran (None without one),
    and the error of the one that failed (the parts after it did not run)."""

    rows: list[Row]
    error: psycopg.Error | None = None

    def raised(self) -> list[Row]:
        """The rows, or the error raised."""
        if self.error is not None:
            raise self.error
        return self.rows


def _answers(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    results: Sequence[pq.abc.PGresult],
    prepares: int,
) -> Answers:
    """The script's results past its PREPAREs, as ``Answers``."""
    rows: list[Row] = []
    load = Transformer(conn)
    for index, result in enumerate(results):
        if result.status == pq.ExecStatus.FATAL_ERROR:
            return Answers(rows, errors.error_from_result(result, conn.info.encoding))
        if index < prepares:
            continue
        if result.status == pq.ExecStatus.TUPLES_OK and result.ntuples:
            load.set_pgresult(result)
            rows.append(load.load_row(0, tuple))
        else:
            rows.append(None)
    return Answers(rows)


class Next(enum.Enum):
    """What follows a script's answers (``after``)."""

    DONE = "done"
    FROM_IDLE = "from_idle"  # rolled back, sent again
    FROM_SAVEPOINT = "from_savepoint"  # back to the script's savepoint, sent again


def after(done: Answers, parts: Sequence[Part], *, idle: bool, last: bool) -> Next:
    """Whether a script whose statements may have been lost is sent again, and how (pure).

    Lost from idle (``DISCARD ALL`` by someone), it failed at its first ``EXECUTE``, before
    anything committed: rolled back and sent again. Lost inside the transaction it was
    sent in (a step function's ``DEALLOCATE ALL``, or psycopg's after a ``ROLLBACK`` the
    function made), before the script's first ``COMMIT``: back to the savepoint the
    script began with, what the step did kept, and sent again; lost again, that raises
    ``StatementsLostError``. Lost past its ``COMMIT``, what came before stands: the
    answers say where it stopped.
    """
    if not isinstance(done.error, errors.InvalidSqlStatementName):
        return Next.DONE
    if idle:
        return Next.DONE if last else Next.FROM_IDLE
    commits = [i for i, part in enumerate(parts) if part == "COMMIT"]
    if len(done.rows) > (commits[0] if commits else len(parts)):
        return Next.DONE
    if last:
        raise StatementsLostError(LOST) from done.error
    return Next.FROM_SAVEPOINT


def _noted(conn: Any, done: Answers, results: int, fresh: list[str]) -> None:
    """Note what a script's PREPAREs left on ``conn``; lost statements make it unknown.

    ``results``: how many statements answered (its PREPAREs ran if any past them did).
    """
    # The PREPAREs come first: all ran unless one of them failed (the last to answer).
    ran = len(fresh) if done.error is None or results > len(fresh) else results - 1
    PREPARED.add(conn, fresh[:ran])
    if isinstance(done.error, errors.InvalidSqlStatementName):
        PREPARED.forget(conn)


def _script(parts: Sequence[Part], *, idle: bool) -> list[Part]:
    """The parts as sent: inside a transaction, after a savepoint to come back to."""
    return list(parts) if idle else [_SAVEPOINT, *parts]


def _answered(done: Answers, *, idle: bool) -> Answers:
    """The answers of the parts as given (the savepoint's taken out)."""
    return done if idle else Answers(done.rows[1:], done.error)


def answers(conn: psycopg.Connection[Any], parts: Sequence[Part]) -> Answers:
    """Run ``parts`` as one script on ``conn`` (autocommit, idle or in a transaction the
    scripts began); what came of each.

    A session that lost prepared statements is sent the script again as ``after``
    decides, with the ``PREPARE`` of every statement the server says it lacks. (Were
    only a later statement lost from idle, the attempt would be found made by this very
    try: a step that is not idempotent then waits for a person, the safe side.) A lost
    connection raises ``OperationalError``.
    """
    for last in (False, True):
        idle = conn.info.transaction_status == pq.TransactionStatus.IDLE
        ready = PREPARED.ready(conn)
        if ready is None:  # read from the server (a statement of psycopg's own)
            ready = {name for (name,) in conn.execute(_SERVER_HAS).fetchall()}
            PREPARED.known(conn, list(ready))
        text, fresh = render(_script(parts, idle=idle), ready, quoter(conn))
        with conn.lock:
            conn.pgconn.send_query(text.encode(conn.info.encoding))
            results = conn.wait(generators.execute(conn.pgconn))
        done = _answers(conn, results, len(fresh))
        _noted(conn, done, len(results), fresh)
        done = _answered(done, idle=idle)
        step = after(done, parts, idle=idle, last=last)
        if step is Next.FROM_IDLE:
            roll_back_scripts(conn)
        elif step is Next.FROM_SAVEPOINT:
            back_to(conn, _BACK)
        else:
            return done
    raise AssertionError("unreachable")


def send(conn: psycopg.Connection[Any], parts: Sequence[Part]) -> list[Row]:
    """``answers``, each part's first row; the first error raised."""
    return answers(conn, parts).raised()


async def answers_async(aconn: psycopg.AsyncConnection[Any], parts: Sequence[Part]) -> Answers:
    """``answers`` on an async connection."""
    for last in (False, True):
        idle = aconn.info.transaction_status == pq.TransactionStatus.IDLE
        ready = PREPARED.ready(aconn)
        if ready is None:
            ready = {name for (name,) in await (await aconn.execute(_SERVER_HAS)).fetchall()}
            PREPARED.known(aconn, list(ready))
        text, fresh = render(_script(parts, idle=idle), ready, quoter(aconn))
        async with aconn.lock:
            aconn.pgconn.send_query(text.encode(aconn.info.encoding))
            results = await aconn.wait(generators.execute(aconn.pgconn))
        done = _answers(aconn, results, len(fresh))
        _noted(aconn, done, len(results), fresh)
        done = _answered(done, idle=idle)
        step = after(done, parts, idle=idle, last=last)
        if step is Next.FROM_IDLE:
            await roll_back_scripts_async(aconn)
        elif step is Next.FROM_SAVEPOINT:
            await back_to_async(aconn, _BACK)
        else:
            return done
    raise AssertionError("unreachable")


async def send_async(aconn: psycopg.AsyncConnection[Any], parts: Sequence[Part]) -> list[Row]:
    """``send`` on an async connection."""
    return (await answers_async(aconn, parts)).raised()
