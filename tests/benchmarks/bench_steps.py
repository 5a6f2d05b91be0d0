"""Step routes: in-order rate, against the projection consumer and with early arrivals.

Events: 500 entities x 60 steps, interleaved entity by entity. The step function
appends one row per step (the test handler), called once per step; the same rows are
written by a ``many`` function (one call and one statement per batch) and by an ``sql``
handler (the statement run for each step, a batch's sent together), and a function
that does nothing measures the ordering alone. On the same topic, the projection
consumer writes the newest step of each entity. A second topic carries the same
events with 10% of them moved up to 5 places earlier within their entity, so they
park and drain. Last, 10,000 events are parked straight into Redis to measure
memory per parked event against the event's own size.
"""

from __future__ import annotations

import os
import random
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import redis
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from consumer import tables
from consumer.kinds.steps.parking import ParkingLot
from schemas import Event, encode
from tests.benchmarks.fixtures import consume_until, consumer_settings, temp_schema
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration import step_handlers

ENTITIES = sized(500, 30)
STEPS = sized(60, 10)
PARKED = sized(10_000, 300)
STEP_ROUTES = """[[route]]
stream = "ledger"
kind = "step"
[route.handlers]
"ledger.added" = "tests.integration.step_handlers:record"
"""
NOOP_ROUTES = STEP_ROUTES.replace("step_handlers:record", "step_handlers:nothing")
MANY_ROUTES = STEP_ROUTES.replace(
    '"tests.integration.step_handlers:record"',
    '{ function = "tests.integration.step_handlers:record_many", many = true }',
)
# The same row a step, written by a statement the consumer runs for each step.
SQL_ROUTES = STEP_ROUTES.replace(
    '"tests.integration.step_handlers:record"',
    '{ sql = "INSERT INTO applied_steps (entity_id, generation, seq, event_type) VALUES '
    '(%(entity_id)s, %(generation)s, %(seq)s, %(event_type)s)" }',
)
PROJECTION_ROUTES = """[[route]]
stream = "ledger"
kind = "projection"
table = "ledger_view"
key = "entity_id"
[route.columns]
amount = "amount"
"""


def _event(entity: int, seq: int) -> Event:
    return Event(
        f"l{entity}:1:{seq}",
        "ledger.added",
        "ledger",
        f"l{entity}",
        1,
        seq,
        "2026-11-30T10:00:00Z",
        "2026-11-30T10:00:01Z",
        {"amount": seq},
    )


def _in_order() -> list[Event]:
    return [_event(e, s) for s in range(1, STEPS + 1) for e in range(ENTITIES)]


def _reordered() -> list[Event]:
    rng = random.Random(9)
    per_entity = []
    for e in range(ENTITIES):
        seqs = list(range(1, STEPS + 1))
        for index in range(STEPS):
            if rng.random() < 0.1:
                to = max(0, index - rng.randint(1, 5))
                seqs.insert(to, seqs.pop(index))
        per_entity.append([_event(e, s) for s in seqs])
    return [per_entity[e][i] for i in range(STEPS) for e in range(ENTITIES)]


@contextmanager
def _topic(bootstrap: str, events: list[Event]) -> Iterator[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"bench.steps.{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 6, 1)])[name].result(timeout=30)
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for event in events:
            producer.produce(name, encode(event), event.key)
            producer.poll(0)
        producer.flush(120)
        yield name
    finally:
        admin.delete_topics([name])[name].result(timeout=30)


def _run(url: str, topic: str, routes: Path, done: str, prefix: str) -> float:
    settings = consumer_settings(url, topic, routes, redis_key_prefix=prefix)
    return ENTITIES * STEPS / consume_until(settings, url, done, ENTITIES)


def _fresh_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS applied_steps")
        conn.execute(step_handlers.TABLE)
        # The consumer's tables belong to its migrations: emptied, never dropped. Every
        # table a step run writes, the calls' attempts too: a run that met the attempts of
        # the run before, for the same entities and seqs, took other paths than a fresh one.
        tables.migrate(conn)
        conn.execute(
            "TRUNCATE inorder_step_progress, inorder_step_log, inorder_step_attempts,"
            " inorder_step_failures"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS ledger_view (entity_id text PRIMARY KEY,"
            " generation bigint, seq bigint, amount bigint)"
        )
        conn.execute("TRUNCATE ledger_view")


def _redis_bytes_per_parked(prefix: str) -> tuple[float, float]:
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    lot = ParkingLot(client, prefix)
    events = [_event(e, s) for e in range(PARKED // 100) for s in range(2, 102)]
    before = int(client.info("memory")["used_memory"])
    lot.park("ledger", [(e.entity_id, e.seq, encode(e)) for e in events], (1000, 2**30), 3600)
    after = int(client.info("memory")["used_memory"])
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
    return (after - before) / len(events), sum(len(encode(e)) for e in events) / len(events)


def run() -> list[BenchResult]:
    """Step rates in order and reordered, against projection; Redis bytes per parked event."""
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    prefix = f"bench.{uuid.uuid4().hex[:6]}"
    progress = f"SELECT count(*) FROM inorder_step_progress WHERE last_applied = {STEPS}"  # noqa: S608
    projected = f"SELECT count(*) FROM ledger_view WHERE seq = {STEPS}"  # noqa: S608
    with (
        temp_schema(os.environ["DATABASE_URL"], "bench_steps") as url,
        tempfile.TemporaryDirectory() as folder,
        _topic(bootstrap, _in_order()) as ordered,
        _topic(bootstrap, _reordered()) as shuffled,
    ):
        steps_file, projection_file = Path(folder, "steps.toml"), Path(folder, "projection.toml")
        noop_file, many_file = Path(folder, "noop.toml"), Path(folder, "many.toml")
        sql_file = Path(folder, "sql.toml")
        sql_file.write_text(SQL_ROUTES)
        steps_file.write_text(STEP_ROUTES)
        noop_file.write_text(NOOP_ROUTES)
        many_file.write_text(MANY_ROUTES)
        projection_file.write_text(PROJECTION_ROUTES)
        _fresh_tables(url)
        noop = _run(url, ordered, noop_file, progress, prefix)
        _fresh_tables(url)
        in_order = _run(url, ordered, steps_file, progress, prefix)
        _fresh_tables(url)
        many = _run(url, ordered, many_file, progress, prefix)
        _fresh_tables(url)
        statement = _run(url, ordered, sql_file, progress, prefix)
        projection = _run(url, ordered, projection_file, projected, prefix)
        _fresh_tables(url)
        reordered = _run(url, shuffled, steps_file, progress, prefix)
    per_event, payload = _redis_bytes_per_parked(prefix)
    how = f"{ENTITIES} entities x {STEPS} steps, one row written per step"
    return [
        BenchResult("steps_inorder_per_s", in_order, "steps/s", how),
        BenchResult("steps_projection_per_s", projection, "events/s", "same topic, projection"),
        BenchResult("steps_vs_projection", in_order / projection, "x", "goal >= 0.5"),
        BenchResult("steps_many_per_s", many, "steps/s", "same rows, one many call per batch"),
        BenchResult("steps_many_vs_projection", many / projection, "x", "set-based step function"),
        BenchResult("steps_sql_per_s", statement, "steps/s", "same rows, an sql handler"),
        BenchResult("steps_sql_vs_projection", statement / projection, "x", "goal >= 0.5"),
        BenchResult("steps_noop_per_s", noop, "steps/s", "same, step function does nothing"),
        BenchResult("steps_noop_vs_projection", noop / projection, "x", "ordering cost alone"),
        BenchResult("steps_reordered_per_s", reordered, "steps/s", "10% up to 5 places early"),
        BenchResult("steps_reordered_vs_inorder", reordered / in_order, "x", "goal >= 0.8"),
        BenchResult("redis_bytes_per_parked_event", per_event, "bytes", f"{PARKED:,} parked"),
        BenchResult(
            "redis_parked_vs_payload", per_event / payload, "x", f"event is {payload:.0f} B"
        ),
    ]
