"""Batch reassembly: worker results applied and assembled, against a projection of the same events.

1,000 batches of 100 items. Every manifest is on the topic first; then each batch's
100 results in a random order, batches overlapping in a window of 50 (results of
up to 50 batches interleave, as when many workers share a queue). The same
results, on the same topic, also feed a plain projection route (newest result per
position) for a side-by-side ratio.
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
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from consumer import tables
from producer import migrate
from schemas import encode
from schemas.batches import BatchItem, WorkItem, batch_events, result_event
from tests.benchmarks.fixtures import consume_until, consumer_settings, temp_schema
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration.batch_support import as_event

BATCHES = sized(1000, 20)
ITEMS = sized(100, 10)
WINDOW = 50
BATCH_ROUTES = '[[route]]\nstream = "batch"\nkind = "batch"\n'
PROJECTION_ROUTES = """[[route]]
stream = "batch_result"
kind = "projection"
table = "result_view"
key = "item_id"
[route.columns]
result_ref = "result_ref"
"""


def _events() -> list[bytes]:
    rng = random.Random(11)
    keys = [f"item-{i:03d}" for i in range(1, ITEMS + 1)]
    values: list[bytes] = []
    finishing: list[list[bytes]] = []
    for b in range(BATCHES):
        batch_id = f"bench-{b:05d}"
        accepted = batch_events(batch_id, [BatchItem(k) for k in keys])[0]
        values.append(encode(as_event(accepted)))
        results = [
            encode(as_event(result_event(WorkItem(batch_id, p, k, 1), result_ref=f"r/{k}")))
            for p, k in enumerate(keys, start=1)
        ]
        rng.shuffle(results)
        finishing.append(results)
    for start in range(0, BATCHES, WINDOW):
        window = [r for results in finishing[start : start + WINDOW] for r in results]
        rng.shuffle(window)
        values += window
    return values


@contextmanager
def _topic(bootstrap: str, values: list[bytes]) -> Iterator[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"bench.batches.{uuid.uuid4().hex[:8]}"
    # The projection run dead-letters the manifests (no route for them there).
    for topic in (name, f"{name}.dlq"):
        admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(timeout=30)
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for n, value in enumerate(values):
            producer.produce(name, value, str(n % 997).encode())
            producer.poll(0)
        producer.flush(120)
        yield name
    finally:
        for topic in (name, f"{name}.dlq"):
            admin.delete_topics([topic])[topic].result(timeout=30)


def _run(url: str, topic: str, routes: Path, done: str, want: int) -> float:
    settings = consumer_settings(url, topic, routes)
    return BATCHES * ITEMS / consume_until(settings, url, done, want)


def run() -> list[BenchResult]:
    """Items per second through the batch route, and against a projection of the same results."""
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    with (
        temp_schema(os.environ["DATABASE_URL"], "bench_batches") as url,
        tempfile.TemporaryDirectory() as folder,
        _topic(bootstrap, _events()) as topic,
    ):
        with psycopg.connect(url, autocommit=True) as conn:
            migrate.apply(conn)
            tables.migrate(conn)
            conn.execute(
                "CREATE TABLE result_view (item_id text PRIMARY KEY, generation bigint, "
                "seq bigint, result_ref text)"
            )
        batch_file, projection_file = Path(folder, "batch.toml"), Path(folder, "projection.toml")
        batch_file.write_text(BATCH_ROUTES)
        projection_file.write_text(PROJECTION_ROUTES)
        complete = "SELECT count(*) FROM inorder_batches WHERE status = 'complete'"
        batch_rate = _run(url, topic, batch_file, complete, BATCHES)
        projected = "SELECT count(*) FROM result_view"
        projection_rate = _run(url, topic, projection_file, projected, BATCHES * ITEMS)
        with psycopg.connect(url) as conn:
            ordered = conn.execute(
                "SELECT count(*) FROM outbox WHERE event_type = 'batch.assembled' AND "
                "(SELECT array_agg((r->>'position')::int) FROM jsonb_array_elements("
                "payload->'results') AS r) = (SELECT array_agg(g) FROM generate_series(1, %s) g)",
                (ITEMS,),
            ).fetchone()
    how = f"{BATCHES:,} batches x {ITEMS} items, random finishing order, {WINDOW} batches overlap"
    return [
        BenchResult("batch_items_per_s", batch_rate, "items/s", how),
        BenchResult("batch_projection_per_s", projection_rate, "events/s", "same results"),
        BenchResult("batch_vs_projection", batch_rate / projection_rate, "x", "same run"),
        BenchResult(
            "batches_assembled_in_order",
            float(ordered[0] if ordered else 0),
            "batches",
            f"of {BATCHES:,}; each output checked 1..{ITEMS}",
        ),
    ]
