"""Fixtures of the integration tests: the outbox and the relay's topics; the example
projection table and its routes file for the consumer's; a step route's store and a
lane's connection.

A module that needs another routes file defines its own ``routes`` fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from consumer.kinds.steps.store import StepStore
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import relay_support as rs
from tests.integration import step_support as ss


@pytest.fixture
def steps_db(pg_schema: PgSchema) -> PgSchema:
    """The test's schema with the consumer's tables and the log the step handlers write."""
    ss.prepare(pg_schema)
    return pg_schema


@pytest.fixture
def outbox(pg_schema: PgSchema) -> PgSchema:
    """The test's schema with the outbox table (every migration) in it."""
    rs.prepare_outbox(pg_schema)
    return pg_schema


@pytest.fixture
def topics(topic_factory: TopicFactory) -> rs.RelayTopics:
    """The events, republish-request and republish-result topics of one relay test."""
    return rs.RelayTopics(
        topic_factory("events"), topic_factory("requests"), topic_factory("results")
    )


@pytest.fixture
def view(pg_schema: PgSchema) -> PgSchema:
    """The test's schema with the example billing_view projection table in it."""
    cs.create_view(pg_schema)
    return pg_schema


@pytest.fixture
def routes(tmp_path: Path) -> Path:
    """A routes file with the example projection route."""
    path = tmp_path / "routes.toml"
    path.write_text(cs.ROUTES)
    return path


class _StepRoute:
    stream = ss.STREAM
    baseline = False


@pytest.fixture
def step_store(pg_schema: PgSchema) -> StepStore:
    """The store of the ``ledger`` step route, its tables made in the test's schema."""
    ss.prepare(pg_schema)
    return StepStore(_StepRoute())  # type: ignore[arg-type]


@pytest.fixture
def lane(pg_schema: PgSchema) -> Iterator[psycopg.Connection[Any]]:
    """A connection as a lane's: idle, in autocommit."""
    conn = pg_schema.connect(autocommit=True)
    yield conn
    conn.close()
