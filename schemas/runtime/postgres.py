"""Every program's PostgreSQL connection, opened one way: named, bounded, JSON read by orjson.

Each connection carries its program's name (``application_name``, so ``pg_stat_activity``
tells the relay from the consumer), gives up connecting after ``connect_timeout``
seconds instead of waiting on a dead host for minutes, and sends TCP keepalives so a
peer that vanished without a FIN (a cut link, a failed-over host) is noticed within a
minute instead of the kernel's two hours. A value given in the URL (or through libpq's
own ``PGAPPNAME`` / ``PGCONNECT_TIMEOUT``) always wins over these defaults.
"""

from __future__ import annotations

import os
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
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}
# The environment variables libpq reads for the same parameters.
_ENVIRONMENT = {"application_name": "PGAPPNAME", "connect_timeout": "PGCONNECT_TIMEOUT"}


def parameters(url: str, program: str) -> dict[str, str]:
    """The parameters added to ``url``: the defaults and the name it does not set itself."""
    try:
        given = conninfo_to_dict(url)
    except psycopg.Error:
        return {}  # connecting reports what is wrong with the URL
    wanted = {**DEFAULTS, "application_name": program}
    return {
        name: value
        for name, value in wanted.items()
        if name not in given and _ENVIRONMENT.get(name, "") not in os.environ
    }


def conninfo(url: str | SecretStr, program: str, **libpq: str) -> str:
    """The connection string every connection of ``program`` is opened with."""
    dsn = url.get_secret_value() if isinstance(url, SecretStr) else url
    return make_conninfo(dsn, **{**parameters(dsn, program), **libpq})


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


def pool(url: str | SecretStr, program: str, size: int, **libpq: str) -> ConnectionPool:
    """Up to ``size`` connections opened as ``connect`` opens them, each checked when taken.

    Autocommit, as the program's own connection; opened on demand (none at first) and
    closed after ten idle minutes, so a quiet route holds no connection it does not use.
    """

    def configure(conn: psycopg.Connection[Any]) -> None:
        set_json_loads(orjson.loads, conn)

    return ConnectionPool(
        conninfo(url, program, **libpq),
        configure=configure,
        check=ConnectionPool.check_connection,
        open=True,
        **_sized(program, size),
    )


def async_pool(url: str | SecretStr, program: str, size: int) -> AsyncConnectionPool:
    """``pool``'s asyncio twin, not yet open: ``await`` its ``open()`` on the loop that uses it."""

    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        set_json_loads(orjson.loads, conn)

    return AsyncConnectionPool(
        conninfo(url, program),
        configure=configure,
        check=AsyncConnectionPool.check_connection,
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
