"""pytest fixtures for testing routes with ``consumer.testing`` (loaded as the ``inorder`` plugin).

``inorder_database_url`` and ``inorder_redis`` come from ``DATABASE_URL`` and ``REDIS_URL``;
``inorder_driver(routes, setup=None)`` gives a ``RouteDriver`` on a schema of its own,
dropped (with its Redis keys) when the test ends.

The kit is quiet: unless the suite configured structlog itself, inorder's log lines go
through the standard ``logging`` module, so pytest's own ``--log-level`` (default: warnings
only) decides what a test shows, and a failing test lists them under "Captured log".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog

from consumer.kinds import Route
from consumer.testing._driver import RouteDriver
from consumer.testing._scratch import scratch
from schemas.runtime.redis_client import RedisClient
from schemas.runtime.redis_client import connect as connect_redis

DriverFactory = Callable[..., RouteDriver]


def pytest_configure(config: pytest.Config) -> None:
    """Route structlog through ``logging`` for pytest to filter, unless already configured."""
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


@pytest.fixture
def inorder_database_url() -> str:
    """The PostgreSQL the routes are tested on: ``DATABASE_URL``."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        pytest.fail("set DATABASE_URL to a PostgreSQL where tests may create schemas")
    return url


@pytest.fixture
def inorder_redis() -> Iterator[RedisClient | None]:
    """A client of ``REDIS_URL`` for step routes' parking, or None when it is not set."""
    url = os.environ.get("REDIS_URL")
    if not url:
        yield None
        return
    client = connect_redis(url)
    yield client
    client.close()


@pytest.fixture
def inorder_driver(
    inorder_database_url: str, inorder_redis: RedisClient | None
) -> Iterator[DriverFactory]:
    """Make drivers: ``inorder_driver(routes, setup=create_tables)``, each on a fresh schema."""
    with ExitStack() as stack:

        def make(
            routes: str | Path | Sequence[Route],
            setup: Callable[[psycopg.Connection[Any]], None] | None = None,
        ) -> RouteDriver:
            conn, prefix = stack.enter_context(scratch(inorder_database_url, inorder_redis))
            if setup is not None:
                setup(conn)
            driver = RouteDriver(routes, conn, inorder_redis, key_prefix=prefix)
            stack.callback(driver.close)
            return driver

        yield make
