"""Fixtures of the Debezium suite: the local stack's Kafka Connect worker with Debezium.

Run by ``make test-debezium``, which starts it (``deploy/local/stack up debezium``);
without it the suite fails at once, naming the command.
"""

from __future__ import annotations

import urllib.error

import pytest

from tests.support.debezium import Connect


@pytest.fixture(scope="session")
def connect() -> Connect:
    """The local Kafka Connect worker, with Debezium's PostgreSQL connector installed."""
    worker = Connect.local()
    try:
        plugins = worker.call("GET", "/connector-plugins")
    except (urllib.error.URLError, OSError) as exc:
        pytest.fail(f"no Kafka Connect worker at {worker.url} ({exc}): run make test-debezium")
    assert any("PostgresConnector" in p["class"] for p in plugins)
    return worker
