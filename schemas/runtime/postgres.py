"""Every program's PostgreSQL connection, opened one way: named, bounded, JSON read by orjson.

Each connection carries its program's name (``application_name``, so ``pg_stat_activity``
tells the relay from the consumer) and is bounded both ways, so a cut or blackholed link
is an outage noticed within about 20 seconds rather than a loop blocked for the kernel's
15 minutes or two hours:

- the client gives up connecting after ``connect_timeout`` seconds, sends TCP keepalives
  (5 s idle, then every 5 s, 3 lost) and drops a connection whose sent data stays
  unacknowledged for ``tcp_user_timeout`` (20 s);
- the server is told the same through ``options`` (its own keepalives and user timeout,
  so a backend whose client vanished mid-transaction gives its locks back), a
  ``lock_timeout`` (a wait on a vanished peer's lock is an outage, SQLSTATE 55P03) and a
  ``statement_timeout`` (a statement that runs past it is refused).

A value given in the URL (a parameter, or ``-c name=value`` inside its ``options``),
or through libpq's own environment (``PGAPPNAME``, ``PGCONNECT_TIMEOUT``, ``PGOPTIONS``),
always wins over these defaults.
"""

from __future__ import annotations

import os
import re
import threading
import time
import weakref
from typing import Any

import orjson
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from pydantic import SecretStr

# libpq parameters set unless the URL or the environment sets them.
DEFAULTS: dict[str, str] = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "20000",  # milliseconds
}
# Server settings sent in ``options`` unless the URL's options or PGOPTIONS set them.
SERVER_DEFAULTS: dict[str, str] = {
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "20000",
    "lock_timeout": "30s",
    "statement_timeout": "120s",
}
# The environment variables libpq reads for the same parameters.
_ENVIRONMENT = {"application_name": "PGAPPNAME", "connect_timeout": "PGCONNECT_TIMEOUT"}


def parameters(url: str, program: str, options: str | None = None) -> dict[str, str]:
    """The parameters added to ``url``: the defaults and the name it does not set itself.

    ``options``: the caller's own (a search path), kept in front of the server defaults.
    """
    try:
        given = conninfo_to_dict(url)
    except psycopg.Error:
        return {}  # connecting reports what is wrong with the URL
    wanted = {**DEFAULTS, "application_name": program}
    added = {
        name: value
        for name, value in wanted.items()
        if name not in given and _ENVIRONMENT.get(name, "") not in os.environ
    }
    mine = " ".join(o for o in (str(given.get("options") or ""), options or "") if o)
    server = server_options(mine, os.environ.get("PGOPTIONS", ""))
    if server != mine:
        added["options"] = server
    return added


def server_options(options: str, environment: str = "") -> str:
    """``options`` with ``-c name=value`` added for each server default neither sets."""
    named = f"{options} {environment}".replace("--", "-c ")
    missing = [
        f"-c {name}={value}"
        for name, value in SERVER_DEFAULTS.items()
        if not re.search(rf"(^|[\s-]c\s*){name}\s*=", named)
    ]
    return " ".join(o for o in (options, *missing) if o)


def conninfo(url: str | SecretStr, program: str, **libpq: str) -> str:
    """The connection string every connection of ``program`` is opened with."""
    dsn = url.get_secret_value() if isinstance(url, SecretStr) else url
    added = parameters(dsn, program, libpq.get("options"))
    return make_conninfo(dsn, **{**libpq, **added})


def dsn_of(conn: psycopg.Connection[Any]) -> str:
    """A connection string that opens another connection like ``conn`` (password included)."""
    password = conn.pgconn.password
    extra = {"password": password.decode()} if password else {}
    return make_conninfo(conn.info.dsn, **extra)


def connect(
    url: str | SecretStr, program: str, *, autocommit: bool = True, **libpq: str
) -> psycopg.Connection[Any]:
    """A connection for ``program`` (autocommit unless asked otherwise), JSON read by orjson.

    ``libpq`` adds parameters of the caller's own (``options`` for a search path).
    """
    conn = psycopg.connect(conninfo(url, program, **libpq), autocommit=autocommit)
    set_json_loads(orjson.loads, conn)
    return conn


# A connection taken from a pool this recently is taken again without a check: a check
# is a round trip, and a lane takes a connection for every entity it applies. One that
# broke meanwhile fails its first statement, which the caller takes for an outage. (Noted
# when taken, not when given back: a pool with a ``reset`` hook gives every connection
# back through its worker threads, a hand-off per entity a lane applies.)
RECENT_S = 2.0


class _Taken:
    """When each connection of a pool was last taken (noted by the pool's ``check``)."""

    def __init__(self) -> None:
        self._at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def note(self, conn: Any) -> None:
        with self._lock:
            self._at[conn] = time.monotonic()

    def recent(self, conn: Any) -> bool:
        with self._lock:
            at = self._at.get(conn)
        return at is not None and time.monotonic() - at < RECENT_S


def pool(url: str | SecretStr, program: str, size: int, **libpq: str) -> ConnectionPool:
    """Up to ``size`` connections opened as ``connect`` opens them, each checked when taken
    (unless taken within the last ``RECENT_S``).

    Autocommit, as the program's own connection; opened on demand (none at first) and
    closed after ten idle minutes, so a quiet route holds no connection it does not use.
    """
    taken = _Taken()

    def configure(conn: psycopg.Connection[Any]) -> None:
        set_json_loads(orjson.loads, conn)

    def check(conn: psycopg.Connection[Any]) -> None:
        if not taken.recent(conn):
            ConnectionPool.check_connection(conn)
        taken.note(conn)

    return ConnectionPool(
        conninfo(url, program, **libpq),
        configure=configure,
        check=check,
        open=True,
        **_sized(program, size),
    )


def async_pool(url: str | SecretStr, program: str, size: int) -> AsyncConnectionPool:
    """``pool``'s asyncio twin, not yet open: ``await`` its ``open()`` on the loop that uses it."""

    taken = _Taken()

    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        set_json_loads(orjson.loads, conn)

    async def check(conn: psycopg.AsyncConnection[Any]) -> None:
        if not taken.recent(conn):
            await AsyncConnectionPool.check_connection(conn)
        taken.note(conn)

    return AsyncConnectionPool(
        conninfo(url, program),
        configure=configure,
        check=check,
        open=False,
        **_sized(program, size),
    )


def _sized(program: str, size: int) -> dict[str, Any]:
    """What both pools share: none open at first, idle ones closed, autocommit, a bounded wait."""
    return {
        "name": program,
        "min_size": 0,
        "max_size": size,
        "max_idle": 600,
        "timeout": 10,  # waiting for a connection: as long as opening one may take
        "kwargs": {"autocommit": True},
    }
