"""Session fixtures for the real Kafka, PostgreSQL and Redis, and per-test factories.

A test that needs a service asks for a factory; each factory gives the test names
nobody else uses (topics, a PostgreSQL schema, a Redis key prefix) and removes
them afterwards, so tests are independent and run in any order.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, settings
from psycopg import sql
from psycopg.conninfo import make_conninfo

from schemas.runtime.redis_client import RedisClient
from schemas.runtime.redis_client import connect as connect_redis
from schemas.topics import replication
from tests.support import services as svc

TopicFactory = Callable[..., str]

# Property tests on a shared two-core machine beside Kafka, PostgreSQL and Redis: no
# per-example deadline (speed is measured in benchmarks), and a failure prints what
# replays it. CI and a developer run the same profile, so a failure there is one here.
settings.register_profile(
    "inorder",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("inorder")


@pytest.fixture(scope="session")
def services() -> Iterator[svc.Services]:
    """The real services: environment first, then testcontainers; never a mock."""
    found = svc.from_environment()
    if found is not None:
        yield found
        return
    if svc.docker_reachable():
        with svc.from_testcontainers() as started:
            yield started
        return
    message = (
        "no Kafka/PostgreSQL/Redis: set KAFKA_BOOTSTRAP_SERVERS, DATABASE_URL and REDIS_URL "
        '(eval "$(deploy/local/stack env)") or make a Docker engine reachable'
    )
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _slug(request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")
    return f"{name[:32]}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kafka_admin(services: svc.Services) -> AdminClient:
    """An admin client for the session's Kafka."""
    return AdminClient({"bootstrap.servers": services.kafka_bootstrap})


@pytest.fixture
def topic_factory(
    request: pytest.FixtureRequest, kafka_admin: AdminClient
) -> Iterator[TopicFactory]:
    """Create topics with unique names, replicated as the services would; deleted afterwards."""
    created: list[str] = []

    def create(suffix: str = "events", partitions: int = 3) -> str:
        name = f"t.{_slug(request)}.{suffix}"
        brokers = len(kafka_admin.list_topics(timeout=10).brokers)
        replicas, in_sync = replication(brokers)
        futures = kafka_admin.create_topics(
            [
                NewTopic(
                    name,
                    num_partitions=partitions,
                    replication_factor=replicas,
                    config={"min.insync.replicas": str(in_sync)},
                )
            ],
            operation_timeout=30,
        )
        futures[name].result(timeout=30)
        created.append(name)
        return name

    yield create
    if created:
        for future in kafka_admin.delete_topics(created, operation_timeout=30).values():
            future.result(timeout=30)


class PgSchema:
    """A PostgreSQL schema of one test's own; connections from dsn() see only it first."""

    def __init__(self, database_url: str, name: str) -> None:
        self.database_url = database_url
        self.name = name

    @property
    def conninfo(self) -> str:
        """A connection string whose search_path is this schema, for code that connects itself."""
        return make_conninfo(self.database_url, options=f"-c search_path={self.name}")

    @property
    def url(self) -> str:
        """A postgresql:// URL whose search_path is this schema, for processes configured by URL."""
        return f"{self.database_url}?options=-csearch_path%3D{self.name}"

    def connect(self, **kwargs: object) -> psycopg.Connection:
        """A new connection whose search_path is this schema."""
        return psycopg.connect(self.conninfo, **kwargs)


@pytest.fixture
def pg_schema(request: pytest.FixtureRequest, services: svc.Services) -> Iterator[PgSchema]:
    """A fresh PostgreSQL schema for this test, dropped with everything in it afterwards."""
    name = f"t_{_slug(request)}"
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield PgSchema(services.database_url, name)
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def redis_client(services: svc.Services) -> Iterator[RedisClient]:
    """A client for the session's Redis (a cluster client when REDIS_URL is a cluster)."""
    client = connect_redis(services.redis_url)
    yield client
    client.close()


@pytest.fixture
def redis_prefix(request: pytest.FixtureRequest, redis_client: RedisClient) -> Iterator[str]:
    """A key prefix of this test's own; every key under it is deleted afterwards."""
    prefix = f"t:{_slug(request)}:"
    yield prefix
    keys = list(redis_client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        redis_client.delete(*keys)
