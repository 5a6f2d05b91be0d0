"""Projection consumer against raw consume and the seed's naive handler, on one topic, one run.

100,000 full-state events (1,000 entities x 100 versions, shuffled) are produced
once. Then, each with a fresh consumer group: a plain batch consumer that does
nothing with the messages; the projection consumer (in-process) until every
entity is at version 100, adaptive and then with every batch waiting up to 100 ms
to fill (the fixed wait of earlier releases); the naive handler (one autocommitted upsert per event)
over the first 10,000 messages; and the consumer as its own process, for peak RSS.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from consumer.routes import parse_routes
from consumer.service import ConsumerService
from consumer.settings import ConsumerSettings
from schemas import Event, decode, encode
from schemas.runtime.health import Health
from tests.benchmarks.bench_relay import traceparent
from tests.benchmarks.fixtures import temp_schema
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized

ENTITIES = sized(1000, 50)
VERSIONS = sized(100, 10)
TOTAL = ENTITIES * VERSIONS
NAIVE = sized(10_000, 200)
VIEW = """CREATE TABLE {} (subscription_id text PRIMARY KEY, generation bigint NOT NULL,
seq bigint NOT NULL, plan text, price_cents integer, status text)"""
ROUTES = """[[route]]
stream = "subscription"
kind = "projection"
table = "{table}"
key = "subscription_id"
[route.columns]
plan = "plan"
price_cents = "price_cents"
status = "status"
"""
NAIVE_UPSERT = """INSERT INTO {} (subscription_id, generation, seq, plan, price_cents, status)
VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (subscription_id) DO UPDATE
SET generation = EXCLUDED.generation, seq = EXCLUDED.seq, plan = EXCLUDED.plan,
    price_cents = EXCLUDED.price_cents, status = EXCLUDED.status
WHERE ({}.generation, {}.seq) < (EXCLUDED.generation, EXCLUDED.seq)"""


def _event(entity: int, version: int) -> Event:
    payload = {"plan": ("free", "basic", "pro")[version % 3], "price_cents": version}
    return Event(
        f"subscription:b{entity}:1:{version}",
        "subscription.plan_changed",
        "subscription",
        f"b{entity}",
        1,
        version,
        "2026-11-30T10:00:00Z",
        "2026-11-30T10:00:01Z",
        {**payload, "status": "active"},
    )


def _events() -> list[bytes]:
    events = [encode(_event(e, v)) for e in range(ENTITIES) for v in range(1, VERSIONS + 1)]
    random.Random(11).shuffle(events)
    return events


@contextmanager
def topic_for(bootstrap: str, *, traced: bool = False) -> Iterator[str]:
    """A topic holding the events; ``traced``: each with a trace context of its own."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"bench.consumer.{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 6, 1)])[name].result(timeout=30)
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for i, value in enumerate(_events()):
            headers = [("traceparent", traceparent(i).encode())] if traced else None
            while True:
                try:
                    producer.produce(name, value, decode(value).key, headers=headers)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush(120)
        yield name
    finally:
        admin.delete_topics([name])[name].result(timeout=30)


def _table(url: str) -> str:
    name = f"view_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(VIEW).format(sql.Identifier(name)))
    return name


def _complete(url: str, table: str) -> bool:
    return _count(url, table, at_least=VERSIONS) == ENTITIES


def _count(url: str, table: str, *, at_least: int) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE seq >= %s").format(sql.Identifier(table)),
            (at_least,),
        ).fetchone()
    return int(row[0]) if row else 0


def _group_config(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }


def _raw_consume(bootstrap: str, topic: str) -> float:
    consumer = Consumer(_group_config(bootstrap))
    consumer.subscribe([topic])
    seen = 0
    started = 0.0
    while seen < TOTAL:
        got = sum(1 for m in consumer.consume(1000, 1.0) if m.error() is None)
        if got and not seen:
            started = time.perf_counter()  # steady state: from the first batch on
        seen += got
    rate = seen / (time.perf_counter() - started)
    consumer.close()
    return rate


def _settings(
    url: str, bootstrap: str, routes: Path, topic: str, linger_ms: int = 0
) -> ConsumerSettings:
    return ConsumerSettings(
        DATABASE_URL=url,
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        routes_file=routes,
        topics=[topic],
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        create_topics=False,
        http_port=0,
        dead_letter_topic=f"{topic}.dlq",
        poll_max_messages=1000,
        poll_timeout_ms=100,
        poll_linger_ms=linger_ms,
    )


def projection(url: str, bootstrap: str, topic: str, workdir: Path, linger_ms: int = 0) -> float:
    table = _table(url)
    routes = workdir / f"{table}.toml"
    routes.write_text(ROUTES.format(table=table))
    settings = _settings(url, bootstrap, routes, topic, linger_ms)
    service = ConsumerService(settings, parse_routes(routes.read_text()), Health())
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    while not _count(url, table, at_least=1):  # steady state: from the first batch applied on
        time.sleep(0.005)
    started = time.perf_counter()
    while not _complete(url, table):
        time.sleep(0.02)
    elapsed = time.perf_counter() - started
    service.stop()
    thread.join(60)
    return TOTAL / elapsed


def _naive(url: str, bootstrap: str, topic: str) -> float:
    table = sql.Identifier(_table(url))
    upsert = sql.SQL(NAIVE_UPSERT).format(table, table, table)
    consumer = Consumer(_group_config(bootstrap))
    consumer.subscribe([topic])
    done = 0
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        while done < NAIVE:
            for message in consumer.consume(100, 1.0):
                event = decode(message.value())
                p = event.payload
                conn.execute(
                    upsert,
                    (
                        event.entity_id,
                        event.generation,
                        event.seq,
                        p["plan"],
                        p["price_cents"],
                        p["status"],
                    ),
                )
                done += 1
    rate = done / (time.perf_counter() - started)
    consumer.close()
    return rate


def _peak_rss_mib(url: str, bootstrap: str, topic: str, workdir: Path) -> float:
    table = _table(url)
    routes = workdir / f"{table}.toml"
    routes.write_text(ROUTES.format(table=table))
    settings = _settings(url, bootstrap, routes, topic)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    env.update(
        DATABASE_URL=url,
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        INORDER_ROUTES_FILE=str(routes),
        INORDER_TOPICS=f'["{topic}"]',
        INORDER_GROUP_ID=settings.group_id,
        INORDER_CREATE_TOPICS="false",
        INORDER_HTTP_PORT="0",
        INORDER_POLL_MAX_MESSAGES="1000",
        INORDER_DEAD_LETTER_TOPIC=settings.dead_letter_topic,
        INORDER_LOG_LEVEL="WARNING",
    )
    process = subprocess.Popen([sys.executable, "-m", "consumer"], env=env)
    try:
        while not _complete(url, table):
            time.sleep(0.1)
        status = Path(f"/proc/{process.pid}/status").read_text()
        peak_kib = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM")
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    return peak_kib / 1024


def run() -> list[BenchResult]:
    """Rates of raw consume, the projection consumer and the naive handler, and peak RSS."""
    url = os.environ["DATABASE_URL"]
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    with (
        topic_for(bootstrap) as topic,
        temp_schema(url, "bench_consumer") as schema_url,
        tempfile.TemporaryDirectory() as d,
    ):
        raw = _raw_consume(bootstrap, topic)
        projected = projection(schema_url, bootstrap, topic, Path(d))
        fixed = projection(schema_url, bootstrap, topic, Path(d), linger_ms=100)
        naive = _naive(schema_url, bootstrap, topic)
        rss = _peak_rss_mib(schema_url, bootstrap, topic, Path(d))
    how = f"{TOTAL:,} events, {ENTITIES} entities x {VERSIONS} versions, shuffled"
    return [
        BenchResult("raw_consume_per_s", raw, "msg/s", f"{how}; batch consume, no processing"),
        BenchResult("projection_per_s", projected, "events/s", "inorder-consumer, batch 1000"),
        # Both rates are steady state: timed from the first batch, not from start-up.
        BenchResult("projection_vs_raw_consume", projected / raw, "x", "goal >= 0.3"),
        BenchResult(
            "projection_per_s.fixed_wait",
            fixed,
            "events/s",
            "same, INORDER_POLL_LINGER_MS=100 (each batch waits to fill)",
        ),
        BenchResult("projection_adaptive_vs_fixed_wait", projected / fixed, "x", "goal >= 0.9"),
        BenchResult("naive_per_s", naive, "events/s", f"one upsert + commit per event, {NAIVE:,}"),
        BenchResult("projection_vs_naive", projected / naive, "x", "goal >= 20"),
        BenchResult("consumer_peak_rss_mib", rss, "MiB", "VmHWM of inorder-consumer, same run"),
    ]
