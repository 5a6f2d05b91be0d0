"""Every code block a user would copy from the documentation, run as shown against real services.

Blocks are taken by their ``<!-- example: NAME -->`` mark (``tests.support.docs``); the
unit test ``test_documented_blocks`` checks that no block with a language goes unmarked
and that each mark is run by some test. Other blocks run where their feature is tested
(``routes-test``, ``sqlalchemy-emit``, ``plain-sql``, ``upgrade-online`` ...).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

import schemas
from consumer import examples
from consumer.kinds.batches import BatchRoute
from consumer.routes import parse_routes
from consumer.testing import event
from producer import OutboxEvent, emit, migrate, subscriptions
from schemas.runtime.payloads import default_payload_schemas
from tests.conftest import PgSchema, TopicFactory
from tests.support.docs import CONSUMER, PRODUCER, ROOT, example, module_of
from tests.support.kafka import wait_until
from tests.support.services import Services

BIN = Path(sys.executable).parent
ORDERS = (
    "CREATE TABLE orders (id text PRIMARY KEY, total_cents bigint NOT NULL,"
    " version bigint NOT NULL DEFAULT 1)"
)
ORDERS_VIEW = (
    "CREATE TABLE orders_view (order_id text PRIMARY KEY, total_cents bigint,"
    " generation bigint NOT NULL, seq bigint NOT NULL)"
)


def _schema_folder(folder: Path) -> Path:
    """The front page's schema file, in a folder as the front page names it."""
    (folder / "event-schemas").mkdir()
    (folder / "event-schemas" / "order.created.schema.json").write_text(example("own-type-schema"))
    return folder / "event-schemas"


def test_the_front_page_sql_writes_an_event_its_schema_accepts(
    outbox: PgSchema, tmp_path: Path
) -> None:
    """The front page's SQL, run by psql, creates the order and writes a valid order.created."""
    with outbox.connect(autocommit=True) as conn:
        conn.execute(ORDERS)
    subprocess.run(
        ["psql", outbox.conninfo, "-X", "-q", "-v", "ON_ERROR_STOP=1"],
        input=example("own-type-sql"),
        text=True,
        check=True,
        capture_output=True,
        timeout=60,
    )
    with outbox.connect() as conn:
        row = conn.execute("SELECT entity_id, seq, event_type, payload FROM outbox").fetchone()
    assert row == ("o-1", 1, "order.created", {"total_cents": 1500})
    registry = schemas.PayloadSchemas.configured(_schema_folder(tmp_path), allow_unknown=False)
    registry.validate(row[2], row[3])


def test_the_front_page_routes_file_projects_the_newest_order(inorder_driver: Any) -> None:
    """The front page's routes file keeps each order's newest version, whatever the order."""
    driver = inorder_driver(example("own-type-routes"), setup=lambda c: c.execute(ORDERS_VIEW))
    driver.send([event("o-1", 2, "order.created", {"total_cents": 1500})])
    driver.send([event("o-1", 1, "order.created", {"total_cents": 900})])
    row = driver.conn.execute("SELECT order_id, total_cents, seq FROM orders_view").fetchone()
    assert row == ("o-1", 1500, 2)


def test_the_front_page_commands_run_the_services(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """The front page's shell block, with this stack's addresses, migrates, relays and projects."""
    topic = topic_factory("events")
    block = (
        example("run")
        .replace("postgresql://app@db.internal:5432/app", pg_schema.url)
        .replace("kafka.internal:9092", services.kafka_bootstrap)
        .replace("redis://redis.internal:6379/0", services.redis_url)
    )
    assert pg_schema.url in block
    assert services.kafka_bootstrap in block
    folder = _schema_folder(tmp_path)
    (tmp_path / "routes.toml").write_text(example("own-type-routes"))
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(ORDERS_VIEW)
    name = uuid.uuid4().hex[:8]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("INORDER_")},
        "PATH": f"{BIN}:{os.environ['PATH']}",
        # Only what keeps this run apart from other tests on the same services.
        "INORDER_TOPICS": orjson.dumps([topic]).decode(),
        "INORDER_GROUP_ID": f"front-{name}",
        "INORDER_RELAY_GROUP_ID": f"front-{name}-relay",
        "INORDER_SWEEPER_GROUP_ID": f"front-{name}-sweeper",
        "INORDER_REDIS_KEY_PREFIX": f"front-{name}",
        "INORDER_HTTP_PORT": "0",
        "INORDER_LOG_LEVEL": "WARNING",
    }
    with (tmp_path / "services.log").open("wb") as log:
        shell = subprocess.Popen(
            ["bash", "-e", "-c", block + "\nwait\n"],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        wait_until(lambda: _has_outbox(pg_schema), timeout_s=60)
        with pg_schema.connect() as conn, conn.transaction():
            emit(
                conn,
                OutboxEvent("order", "o-1", 1, "order.created", {"total_cents": 7}, topic=topic),
                schemas=schemas.PayloadSchemas.configured(folder, allow_unknown=False),
            )
        wait_until(lambda: _projected(pg_schema) == (7, 1), timeout_s=90)
        assert shell.poll() is None, (tmp_path / "services.log").read_text()
    finally:
        os.killpg(shell.pid, signal.SIGTERM)
        shell.wait(timeout=60)
        time.sleep(0.5)


def _has_outbox(schema: PgSchema) -> bool:
    with schema.connect() as conn:
        found = conn.execute("SELECT to_regclass('outbox') IS NOT NULL").fetchone()
    return found == (True,)


def _projected(schema: PgSchema) -> tuple[int, int] | None:
    with schema.connect() as conn:
        row = conn.execute("SELECT total_cents, seq FROM orders_view").fetchone()
    return None if row is None else (row[0], row[1])


def test_the_versioning_example_bumps_and_emits_in_one_transaction(
    pg_schema: PgSchema, tmp_path: Path
) -> None:
    """producer/README.md's versioning block bumps the row's version and emits that seq."""
    with pg_schema.connect(autocommit=True) as conn:
        migrate.apply(conn, (migrate.OUTBOX, migrate.EXAMPLE))
        conn.execute(
            "INSERT INTO subscriptions (id, plan, price_cents, version)"
            " VALUES ('s1', 'basic', 900, 3)"
        )
    with pg_schema.connect() as conn:
        module_of("versioning-bump", tmp_path, PRODUCER).upgrade(conn, "s1")
    with pg_schema.connect() as conn:
        row = conn.execute("SELECT entity_id, seq, payload->>'plan' FROM outbox").fetchone()
        plan = conn.execute("SELECT plan, version FROM subscriptions").fetchone()
    assert row == ("s1", 4, "pro")
    assert plan == ("pro", 4)


def test_the_load_generator_command_writes_the_example_service(pg_schema: PgSchema) -> None:
    """producer/README.md's loadgen command, run from the checkout, writes its events."""
    with pg_schema.connect(autocommit=True) as conn:
        migrate.apply(conn, (migrate.OUTBOX, migrate.EXAMPLE))
    [line] = [x for x in example("loadgen", PRODUCER).splitlines() if x.strip()]
    env = {**os.environ, "DATABASE_URL": pg_schema.url, "INORDER_LOG_LEVEL": "WARNING"}
    done = subprocess.run(
        ["bash", "-e", "-c", line.replace(".venv/bin/", f"{BIN}/")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with pg_schema.connect() as conn:
        entities = conn.execute(
            "SELECT count(DISTINCT entity_id) FROM outbox WHERE entity_type = 'subscription'"
        ).fetchone()
    assert entities == (100,)


def test_the_snapshot_command_writes_payloads_the_shipped_schema_accepts(
    pg_schema: PgSchema,
) -> None:
    """producer/README.md's snapshot command writes each subscription's state, schema-valid."""
    with pg_schema.connect(autocommit=True) as conn:
        migrate.apply(conn, (migrate.OUTBOX, migrate.EXAMPLE))
        subscriptions.create_subscription(conn, "s1", "pro")
        subscriptions.create_subscription(conn, "s2", "basic")
        subscriptions.delete_subscription(conn, "s2")
    command = example("snapshot", PRODUCER).replace(".venv/bin/", f"{BIN}/")
    env = {**os.environ, "DATABASE_URL": pg_schema.url, "INORDER_LOG_LEVEL": "WARNING"}
    done = subprocess.run(
        ["bash", "-e", "-c", command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with pg_schema.connect() as conn:
        rows = conn.execute(
            "SELECT entity_id, generation, seq, event_type, payload FROM outbox "
            "WHERE event_type = 'subscription.snapshot' ORDER BY entity_id"
        ).fetchall()
    assert [r[:4] for r in rows] == [
        ("s1", 1, 1, "subscription.snapshot"),
        ("s2", 1, 2, "subscription.snapshot"),
    ]
    registry = default_payload_schemas()
    for row in rows:
        registry.validate(row[3], row[4])
    assert rows[1][4]["status"] == "deleted"


def test_the_projection_route_example_keeps_the_newest(inorder_driver: Any) -> None:
    """consumer/README.md's projection route, on the example table, keeps the newest version."""
    driver = inorder_driver(
        example("projection-route", CONSUMER), setup=lambda c: c.execute(examples.BILLING_VIEW)
    )
    pro = {"plan": "pro", "price_cents": 2900, "status": "active"}
    driver.send([event("s1", 2, "subscription.plan_changed", pro)])
    driver.send([event("s1", 1, "subscription.created", {"plan": "basic"})])
    row = driver.conn.execute("SELECT plan, price_cents, seq FROM billing_view").fetchone()
    assert row == ("pro", 2900, 2)


@pytest.fixture
def billing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """consumer/README.md's billing/steps.py, importable, with a mailer that records mails."""
    package = tmp_path / "billing"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "steps.py").write_text(example("billing-steps", CONSUMER))
    (package / "mailer.py").write_text(
        "SENT = []\n\n\ndef send(to, *, template, idempotency_key):\n"
        "    SENT.append((to, template, idempotency_key))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("billing", "billing.steps", "billing.mailer"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import billing.mailer  # noqa: PLC0415

    return billing.mailer.SENT  # type: ignore[no-any-return]


def _seat_tables(conn: psycopg.Connection) -> None:
    conn.execute(examples.SEAT_TABLES)
    conn.execute("INSERT INTO seat_totals VALUES ('s1', 1, 0)")
    conn.execute("CREATE TABLE customers (subscription_id text PRIMARY KEY, email text)")
    conn.execute("INSERT INTO customers VALUES ('s1', 'ann@example.com')")


@pytest.mark.parametrize("route", ["billing-route", "step-route"])
def test_the_step_handler_example_applies_in_order_and_mails_once(
    inorder_driver: Any, billing: list[tuple[Any, ...]], route: str
) -> None:
    """The handlers, under both documented routes: deltas in seq order, one goodbye mail."""
    driver = inorder_driver(example(route, CONSUMER), setup=_seat_tables)
    closed = event("s1", 3, "seat_ledger.closed", {"reason": "cancelled"})
    driver.send([event("s1", 2, "seat_ledger.seats_added", {"count": 5}), closed])
    driver.send([event("s1", 1, "seat_ledger.seats_added", {"count": 2}), closed])
    seats = driver.conn.execute("SELECT seats FROM seat_totals").fetchone()
    assert seats == (7,)
    assert billing == [("ann@example.com", "goodbye", closed.event_id)]
    if route == "step-route":  # the reference route also names a many and an sql handler
        moved = [event("s1", 4, "seat_ledger.seats_moved", {"count": -1})]
        moved.append(event("s1", 5, "seat_ledger.seats_moved", {"count": -2}))
        driver.send(moved)
        assert driver.conn.execute("SELECT seats FROM seat_totals").fetchone() == (4,)
        set_to = event("s1", 6, "seat_ledger.seats_set", {"count": 10})
        driver.send([event("s1", 7, "seat_ledger.seats_moved", {"count": 1}), set_to])
        assert driver.conn.execute("SELECT seats FROM seat_totals").fetchone() == (11,)


def test_the_batch_route_example_is_a_valid_routes_file() -> None:
    """consumer/README.md's batch route parses to the settings its comments describe."""
    [route] = parse_routes(example("batch-route", CONSUMER))
    assert isinstance(route, BatchRoute)
    assert (route.max_retries, route.deadline_s, route.on_incomplete) == (1, 3600, "hold")
    assert route.result_stream == "batch_result"
