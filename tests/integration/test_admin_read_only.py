"""inorder-admin's reading commands need SELECT only, run no DDL and join no consumer group."""

from __future__ import annotations

import concurrent.futures
import contextlib
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from psycopg import sql

from consumer.kinds.steps.parking import ParkingLot
from tests.conftest import PgSchema, TopicFactory
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.services import Services

BATCH_ROUTE = '\n[[route]]\nstream = "report"\nkind = "batch"\n'


@pytest.fixture
def reader(pg_schema: PgSchema, services: Services) -> tuple[str, str]:
    """A login role that may only read the test's schema: (its name, a URL for it)."""
    role = f"ro_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(pg_schema.name), sql.Identifier(role)
            )
        )
    url = pg_schema.url.replace("postgresql://inorder@", f"postgresql://{role}@", 1)
    yield role, url
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_reading_commands_work_with_a_select_only_role(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
    redis_client,
    reader: tuple[str, str],
) -> None:
    """gaps list, parked top, batches list, audit and explain answer for a SELECT-only role."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    p.settings.routes_file.write_text(ss.routes_text() + BATCH_ROUTE)
    sw.write_outbox(p, range(1, 4))
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inorder_gaps (route, entity_id, generation, from_seq, to_seq, "
            "event_type, status) VALUES ('ledger', 'a', 1, 1, 2, 'ledger.added', 'open')"
        )
    ParkingLot(redis_client, redis_prefix.rstrip(":")).park(
        ss.STREAM, [("a", 3, b"parked")], (100, 2**30), 60
    )
    role, url = reader
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(
                sql.Identifier(pg_schema.name), sql.Identifier(role)
            )
        )
    with psycopg.connect(url) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("DELETE FROM inorder_gaps")
    env = {**sw.env(p), "DATABASE_URL": url}
    results = {
        name: sw.run_tool("inorder-admin", env, *args)
        for name, args in {
            "gaps": ("--json", "gaps", "list"),
            "parked": ("--json", "parked", "top"),
            "batches": ("--json", "batches", "list"),
            "retrying": ("--json", "review", "retrying"),
            "audit": ("--json", "audit"),
            "explain": ("--json", "explain", "ledger:a"),
        }.items()
    }
    for name, result in results.items():
        assert result.returncode == 0, (name, result.stderr)
    assert '"range":"1..2"' in results["gaps"].stdout
    assert '"parked":1' in results["parked"].stdout
    assert '"unexplained":0' in results["audit"].stdout
    assert '"parked":[3]' in results["explain"].stdout
    # The client stays in a name until the answer is in, and an unanswered listing is
    # asked again: once, on a loaded machine, a single request went unanswered for 30 s.
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    listed = None
    for _ in range(3):
        with contextlib.suppress(concurrent.futures.TimeoutError, KafkaException):
            listed = admin.list_consumer_groups(request_timeout=15).result(timeout=20)
            break
    assert listed is not None, "the broker did not list the consumer groups"
    ids = {g.group_id for g in listed.valid}
    assert p.settings.sweeper_group_id not in ids


def test_a_missing_routes_file_is_one_line(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """inorder-admin names the routes file it cannot read in one line, as the services do."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    env = {**sw.env(p), "INORDER_ROUTES_FILE": str(tmp_path / "missing.toml")}
    result = sw.run_tool("inorder-admin", env, "gaps", "list")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"inorder-admin: cannot read INORDER_ROUTES_FILE {tmp_path / 'missing.toml'}: "
        "No such file or directory"
    ]
