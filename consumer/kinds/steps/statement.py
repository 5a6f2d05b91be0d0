"""A step handler given as one SQL statement (``sql``) instead of a Python function.

The statement runs once for each step, in the step's transaction, with the event's
fields as its named parameters (``%(seq)s``). All the due steps of one type in a poll
batch go in one ``executemany``, each entity's in seq order: the server runs the
statements one after another as separate calls would, and the consumer spends no Python
call, cursor or flush a step (the batch's pipeline carries them all). A failure is what
a ``many`` function's is: the batch again one step a call, then only the failing
step's entity stops.

Pure but for ``check`` (start-up: the statement prepares on the server) and the
function ``runner`` makes (run by the step kind's handlers).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb

from schemas import Event

# The parameters a statement may name: the event's fields, its payload as jsonb.
FIELDS = (
    "event_id",
    "event_type",
    "entity_type",
    "entity_id",
    "generation",
    "seq",
    "occurred_at",
    "payload",
)
# A named parameter, a literal percent sign, or any other percent sign (refused).
_TOKEN = re.compile(r"%\((\w+)\)s|%%|%")
_CHECKED = "inorder_step_sql_check"
_INDETERMINATE = "42P18"  # a parameter whose type only its value gives: prepares later


def problem(sql: str) -> str | None:
    """What is wrong with ``sql`` as a step's statement, read without a server; None: fine."""
    if not sql.strip():
        return "is empty"
    for match in _TOKEN.finditer(sql):
        name = match.group(1)
        if match.group(0) == "%":
            return "has a % that is neither a %(field)s parameter nor %% (a percent sign)"
        if name is not None and name not in FIELDS:
            return f"names %({name})s, which is not one of {', '.join(FIELDS)}"
    return None


# The type each parameter has when the step runs: psycopg sends the payload as jsonb and
# the numbers as integers; strings go untyped, the server reading them as their place
# in the statement asks (a timestamp, a uuid, text).
_TYPES = {"payload": "jsonb", "generation": "bigint", "seq": "bigint"}


def prepared(sql: str, name: str) -> str:
    """A ``PREPARE`` of ``sql`` as ``name``: ``$n`` for its named parameters, each typed
    as the step will send it."""
    order: dict[str, int] = {}

    def swap(match: re.Match[str]) -> str:
        field = match.group(1)
        if field is None:
            return "%"
        return f"${order.setdefault(field, len(order) + 1)}"

    body = _TOKEN.sub(swap, sql)
    types = ", ".join(_TYPES.get(field, "unknown") for field in order)
    return f"PREPARE {name} ({types}) AS {body}" if order else f"PREPARE {name} AS {body}"


def named(sql: str) -> frozenset[str]:
    """The parameters ``sql`` names."""
    return frozenset(m.group(1) for m in _TOKEN.finditer(sql) if m.group(1) is not None)


def fields(event: Event, names: frozenset[str] = frozenset(FIELDS)) -> dict[str, Any]:
    """The parameters one step gives its statement (``names`` of them)."""
    values = {name: getattr(event, name) for name in names if name != "payload"}
    if "payload" in names:
        values["payload"] = Jsonb(event.payload, dumps=orjson.dumps)
    return values


def runner(sql: str) -> Callable[[psycopg.Connection[Any], Sequence[Event]], None]:
    """The function that runs ``sql`` once for each of the events, in their order."""
    names = named(sql)

    def run(conn: psycopg.Connection[Any], events: Sequence[Event]) -> None:
        with conn.cursor() as cursor:
            cursor.executemany(sql, [fields(event, names) for event in events])

    return run


def check(conn: psycopg.Connection[Any], sql: str) -> str | None:
    """Why ``sql`` does not prepare on ``conn``'s server (a syntax error, a table or column
    that is not there); None when it does. Nothing is run."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(prepared(sql, _CHECKED))
            conn.execute(f"DEALLOCATE {_CHECKED}")
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        if exc.sqlstate == _INDETERMINATE:
            return None
        return str(exc).strip().splitlines()[0]
    return None
