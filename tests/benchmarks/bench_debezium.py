"""The same projection fed by Debezium or by inorder's relay, one after the other in one run.

``debezium_projection_per_s``: subscription events written to a Debezium outbox table,
published by Debezium's PostgreSQL connector and outbox event router (the local stack's
Kafka Connect worker), projected by a consumer reading the router's topic.
``relay_projection_per_s``: the same events written to inorder's outbox, published by
``inorder-relay`` (a process), projected by the same consumer code. Each figure is events
over the time from the first write to the last entity's newest version in the view; the
rows are written in transactions of 1,000. The suite starts Debezium (``stack up
debezium``) and stops it afterwards.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from confluent_kafka.admin import AdminClient, NewTopic

from consumer import examples
from consumer.routes import parse_routes
from consumer.service import ConsumerService
from consumer.settings import ConsumerSettings
from producer import migrate
from schemas.runtime.health import Health
from tests.benchmarks.fixtures import (
    Pipeline,
    consumer_settings,
    delete_topics,
    pipeline_env,
    service_process,
    temp_schema,
)
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration.relay_support import free_port
from tests.support.debezium import Connect, documented_settings, outbox_config, outbox_connector
from tests.support.docs import DEBEZIUM, example
from tests.support.services import STACK_SCRIPT
from tests.support.threads import serving

ENTITIES = 1000
CHUNK = 1000
# The Debezium page's table and settings.
DEBEZIUM_OUTBOX = example("debezium-outbox-table", DEBEZIUM)
SETTINGS = documented_settings()
# Row i of a run: entity s<i mod ENTITIES>, seq <i div ENTITIES + 1>, a full-state plan.
_DEBEZIUM_INSERT = """
INSERT INTO event_outbox (id, aggregatetype, aggregateid, seq, type, payload)
SELECT gen_random_uuid(), 'subscription', 's' || mod(i, %(entities)s::bigint),
       i / %(entities)s::bigint + 1,
       'subscription.plan_changed',
       jsonb_build_object('plan', 'pro', 'price_cents', i, 'status', 'active')
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
"""
_RELAY_INSERT = """
INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload)
SELECT %(topic)s, 'subscription', 's' || mod(i, %(entities)s::bigint),
       i / %(entities)s::bigint + 1,
       'subscription.plan_changed', 'e' || i,
       jsonb_build_object('plan', 'pro', 'price_cents', i, 'status', 'active')
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
"""
_SETTLED = "SELECT count(*) FROM billing_view WHERE seq = %s"


@contextmanager
def running_consumer(settings: ConsumerSettings) -> Iterator[None]:
    """A consumer serving in a thread until the block ends."""
    service = ConsumerService(settings, parse_routes(settings.routes_file.read_text()), Health())
    with serving("bench-consumer", service.run, service.stop):
        yield


def _write(url: str, statement: str, events: int, **params: str) -> None:
    with psycopg.connect(url) as conn:
        for first in range(0, events, CHUNK):
            last = min(events, first + CHUNK) - 1
            values = {"first": first, "last": last, "entities": ENTITIES, **params}
            conn.execute(statement, values)
            conn.commit()


def _settled(url: str, events: int, since: float, limit_s: float = 600) -> float:
    """Seconds from ``since`` until every entity's newest version is in the view."""
    with psycopg.connect(url) as conn:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            row = conn.execute(_SETTLED, (events // ENTITIES,)).fetchone()
            conn.rollback()
            if row and row[0] == ENTITIES:
                return time.perf_counter() - since
            time.sleep(0.05)
    raise TimeoutError(f"the view did not settle within {limit_s:g} s")


def _topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)])[name].result(
        timeout=30
    )


def _view(url: str, folder: Path) -> Path:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(examples.BILLING_VIEW)
    routes = folder / "routes.toml"
    routes.write_text(examples.PROJECTION_ROUTE)
    return routes


def _debezium(base: str, bootstrap: str, events: int, prefix: str) -> float:
    """Seconds for ``events`` written to a Debezium outbox to be projected."""
    with temp_schema(base, "bench_dbz") as url, tempfile.TemporaryDirectory() as folder:
        schema = url.rsplit("%3D", 1)[1]
        routes = _view(url, Path(folder))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(DEBEZIUM_OUTBOX)
        for suffix in ("events", "subscription"):
            _topic(bootstrap, f"{prefix}.{suffix}")
        replacement = prefix + ".${routedByValue}"
        name = f"bench_{uuid.uuid4().hex[:12]}"
        config = outbox_config(base, schema, name, replacement)
        settings = consumer_settings(
            url,
            f"{prefix}.events",
            routes,
            debezium_topics=[f"{prefix}.subscription"],
            debezium_topic_replacement=replacement,
            debezium_placement=SETTINGS["INORDER_DEBEZIUM_PLACEMENT"],
            log_level="WARNING",
        )
        with outbox_connector(Connect.local(), base, config), running_consumer(settings):
            started = time.perf_counter()
            _write(url, _DEBEZIUM_INSERT, events)
            return _settled(url, events, started)


def _relay(base: str, bootstrap: str, events: int, prefix: str) -> float:
    """Seconds for ``events`` written to inorder's outbox to be projected."""
    with temp_schema(base, "bench_rly") as url, tempfile.TemporaryDirectory() as folder:
        routes = _view(url, Path(folder))
        with psycopg.connect(url, autocommit=True) as conn:
            migrate.apply(conn)
        topic = f"{prefix}.events"
        _topic(bootstrap, topic)
        port = free_port()
        env = pipeline_env(Pipeline(url, bootstrap, topic, Path(folder)), port)
        settings = consumer_settings(url, topic, routes, log_level="WARNING")
        with service_process("outbox_relay", env, port), running_consumer(settings):
            started = time.perf_counter()
            _write(url, _RELAY_INSERT, events, topic=topic)
            return _settled(url, events, started)


def run() -> list[BenchResult]:
    """Debezium-fed and relay-fed projection throughput, side by side."""
    base, bootstrap = os.environ["DATABASE_URL"], os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    events = sized(20_000, 2_000)
    prefix = f"bench.dbz.{uuid.uuid4().hex[:8]}"
    subprocess.run([str(STACK_SCRIPT), "up", "debezium"], check=True, capture_output=True)
    try:
        debezium_s = _debezium(base, bootstrap, events, prefix + ".d")
        relay_s = _relay(base, bootstrap, events, prefix + ".r")
    finally:
        subprocess.run([str(STACK_SCRIPT), "down", "debezium"], check=False, capture_output=True)
        delete_topics(bootstrap, prefix)
    ratio = relay_s / debezium_s
    return [
        BenchResult(
            "debezium_projection_per_s",
            events / debezium_s,
            "events/s",
            f"{events} events over {ENTITIES} entities, Debezium to view; "
            f"{ratio:.2f}x the relay-fed rate",
        ),
        BenchResult(
            "relay_projection_per_s",
            events / relay_s,
            "events/s",
            "the same events, inorder-relay to view, in the same run",
        ),
    ]
