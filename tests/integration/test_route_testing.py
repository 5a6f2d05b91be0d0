"""consumer.testing: users' routes driven without Kafka, checked under any arrival order."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from consumer.testing import OrderDependenceError, check_order_independence, event
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import route_checks as rc
from tests.support.docs import CONSUMER, example
from tests.support.kafka import wait_until
from tests.support.services import Services


def _rows(conn, table: str, columns: list[str] | None) -> list[tuple]:
    names = ", ".join(columns) if columns else "*"
    return sorted(conn.execute(f"SELECT {names} FROM {table}").fetchall())  # noqa: S608


def test_the_example_services_routes_are_order_independent(
    services: Services, redis_client: redis.Redis
) -> None:
    """The example projection and step handlers give the in-order rows for every arrival."""
    check_order_independence(
        rc.EXAMPLE_ROUTES,
        rc.example_events(),
        database_url=services.database_url,
        tables=rc.EXAMPLE_TABLES,
        setup=rc.create_example_tables,
        redis_client=redis_client,
        max_examples=20,
    )


def test_a_handler_that_depends_on_arrival_order_is_caught_with_the_smallest_order(
    services: Services, redis_client: redis.Redis
) -> None:
    """Appending across entities is caught, with the smallest arrival: b in one batch, a next."""
    events = [event("a", 1, "post.published"), event("b", 1, "post.published")]
    with pytest.raises(OrderDependenceError) as caught:
        check_order_independence(
            rc.FEED_ROUTES,
            events,
            database_url=services.database_url,
            tables={"feed": None},
            setup=rc.create_feed,
            redis_client=redis_client,
        )
    message = str(caught.value)
    assert "feed differs from the in-order result after this arrival" in message
    assert "(poll batches split by |): b#1 | a#1\n" in message
    assert "[(1, ['a#1', 'b#1'])]" in message  # the in-order row, not found


def test_the_driver_ends_where_the_real_consumer_ends(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
    inorder_driver,
) -> None:
    """The same shuffled events with duplicates: the driver's rows equal the consumer's."""
    events = rc.example_events()
    arrival = events + random.Random(7).sample(events, 5)
    random.Random(11).shuffle(arrival)
    routes = tmp_path / "routes.toml"
    routes.write_text(rc.EXAMPLE_ROUTES)
    with pg_schema.connect(autocommit=True) as conn:
        rc.create_example_tables(conn)
    topic = topic_factory("events")
    settings = cs.parking_settings_for(
        pg_schema,
        services,
        routes,
        topic,
        topic_factory("dlq"),
        redis_prefix,
        held_topic=topic_factory("held"),
    )

    def done(conn) -> bool:
        seats = _rows(conn, "seat_totals", None)
        views = _rows(conn, "billing_view", ["seq"])
        return [s[2] for s in seats] == [4, 4] and views == [(3,), (3,)]

    with pg_schema.connect(autocommit=True) as conn, cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, arrival)
        wait_until(lambda: done(conn))
        consumer = {t: _rows(conn, t, c) for t, c in rc.EXAMPLE_TABLES.items()}
    driver = inorder_driver(rc.EXAMPLE_ROUTES, setup=rc.create_example_tables)
    for start in range(0, len(arrival), 4):
        driver.send(arrival[start : start + 4])
    driven = {t: _rows(driver.conn, t, c) for t, c in rc.EXAMPLE_TABLES.items()}
    assert driven == consumer
    assert consumer["seat_totals"] == [("s1", 1, 4), ("s2", 1, 4)]


def _users_pytest(
    folder: Path, services: Services, *options: str
) -> subprocess.CompletedProcess[str]:
    env = {"DATABASE_URL": services.database_url, "REDIS_URL": services.redis_url, "PATH": ""}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_readme_example_runs_as_a_users_test(services: Services, tmp_path: Path) -> None:
    """The README's test file, run by pytest with the inorder plugin's fixtures, passes."""
    (tmp_path / "test_my_routes.py").write_text(example("routes-test", CONSUMER))
    done = _users_pytest(tmp_path, services)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_the_kit_logs_nothing_below_warning_unless_asked(
    services: Services, tmp_path: Path
) -> None:
    """Uncaptured, a user's suite shows no inorder info lines; pytest's log level shows them."""
    (tmp_path / "test_my_routes.py").write_text(example("routes-test", CONSUMER))
    quiet = _users_pytest(tmp_path, services, "-s")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "migration_applied" not in quiet.stdout + quiet.stderr
    assert '"level"' not in quiet.stdout + quiet.stderr
    asked = _users_pytest(tmp_path, services, "-o", "log_cli=true", "--log-cli-level=INFO")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert '"event": "migration_applied"' in asked.stdout


def test_the_driver_awaits_async_handlers_on_a_connection_like_its_own(
    pg_schema: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """An async def handler runs under RouteDriver: its async connection sees the same schema."""
    from consumer.testing import RouteDriver  # noqa: PLC0415
    from tests.integration import step_handlers  # noqa: PLC0415

    routes = (
        '[[route]]\nstream = "ledger"\nkind = "step"\n[route.handlers]\n'
        '"ledger.awaited" = "tests.integration.step_handlers:slow_call_async"\n'
    )
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(step_handlers.TABLE)
        driver = RouteDriver(routes, conn, redis_client, key_prefix=redis_prefix.rstrip(":"))
        sent = driver.send([event("d", s, "ledger.awaited") for s in (2, 1)])
        assert [e.seq for e in sent.outcomes["ledger"].applied] == [1, 2]
        rows = conn.execute("SELECT seq FROM applied_steps WHERE entity_id = 'd' ORDER BY n")
        assert [r[0] for r in rows.fetchall()] == [1, 2]
        driver.close()
