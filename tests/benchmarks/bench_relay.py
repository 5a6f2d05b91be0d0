"""Relay throughput against a raw producer, and commit-to-delivery latency with and without NOTIFY.

Throughput: a backlog of rows is published by one in-process relay, timed from its
first published row; the same envelopes are then sent by a plain confluent-kafka
producer with the same delivery guarantees (idempotent, acks=all); then the relay
again, with the marking of one batch not overlapping the next. Latency: a writer commits 10 rows
every 10 ms (1,000 rows/s); the topic stamps LogAppendTime, so the broker's
append time (when the relay's delivery report is issued) is compared with each
row's commit time.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from producer import OutboxEvent, emit_many, migrate
from schemas import decode
from schemas.runtime.health import Health
from tests.benchmarks.fixtures import temp_schema
from tests.benchmarks.result import BenchResult

BACKLOG = 50_000
RATE_ROWS_S = 1000
LATENCY_S = 10.0
PAYLOAD = {"plan": "pro", "price_cents": 2900, "status": "active"}


@contextmanager
def _topics(bootstrap: str, count: int) -> Iterator[list[str]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [f"bench.relay.{uuid.uuid4().hex[:8]}.{i}" for i in range(count)]
    config = {"message.timestamp.type": "LogAppendTime"}
    futures = admin.create_topics([NewTopic(n, 6, 1, config=config) for n in names])
    for future in futures.values():
        future.result(timeout=30)
    try:
        yield names
    finally:
        for future in admin.delete_topics(names).values():
            future.result(timeout=30)


def _events(topic: str, count: int, tag: str) -> list[OutboxEvent]:
    return [
        OutboxEvent(
            "subscription",
            f"{tag}-{i % 1000}",
            i // 1000 + 1,
            "subscription.plan_changed",
            PAYLOAD,
            topic=topic,
        )
        for i in range(count)
    ]


def _settings(url: str, bootstrap: str, **overrides: Any) -> RelaySettings:
    return RelaySettings(
        DATABASE_URL=url,
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        create_topics=False,
        http_port=0,
        relay_group_id=f"bench-{uuid.uuid4().hex[:8]}",
        batch_size=1000,
        **overrides,
    )


@contextmanager
def _relay(settings: RelaySettings, *, listen: bool) -> Iterator[Relay]:
    relay = Relay(settings, Health(), listen=listen)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        relay.stop()
        thread.join(60)


def _pending(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL").fetchone()
    return int(row[0]) if row else 0


def _throughput(
    url: str, bootstrap: str, topic: str, *, overlap: bool = True
) -> tuple[float, list[bytes]]:
    """Rows/s publishing a backlog, timed from the first row published (steady state)."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrate.apply(conn)
        for start in range(0, BACKLOG, 5000):
            with conn.transaction():
                emit_many(conn, _events(topic, BACKLOG, "tp")[start : start + 5000])
    with _relay(_settings(url, bootstrap, overlap_marking=overlap), listen=True):
        while (left := _pending(url)) == BACKLOG:
            time.sleep(0.005)
        started = time.perf_counter()
        while _pending(url):
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
    return left / elapsed, _read_values(bootstrap, topic, BACKLOG)


def _read_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 120
    while len(values) < count and time.monotonic() < deadline:
        values.extend(m.value() for m in consumer.consume(1000, 0.5) if m.error() is None)
    consumer.close()
    return values


def _raw_produce(bootstrap: str, topic: str, values: list[bytes]) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
        }
    )
    keys = [decode(v).key for v in values]
    started = time.perf_counter()
    for key, value in zip(keys, values, strict=True):
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    return len(values) / (time.perf_counter() - started)


def _latencies(url: str, bootstrap: str, topic: str, *, listen: bool) -> list[float]:
    committed: dict[str, float] = {}
    stop = threading.Event()

    def writer() -> None:
        tag = uuid.uuid4().hex[:6]
        batch = RATE_ROWS_S // 100
        with psycopg.connect(url) as conn:
            for tick in range(int(LATENCY_S * 100)):
                due = started + tick / 100
                time.sleep(max(0.0, due - time.perf_counter()))
                events = _events(topic, batch, f"{tag}-{tick}")
                with conn.transaction():
                    emit_many(conn, events)
                now = time.time()
                for event in events:
                    committed[event.resolved_event_id] = now
                if stop.is_set():
                    return

    settings = _settings(url, bootstrap, poll_interval_s=1.0)
    with _relay(settings, listen=listen):
        time.sleep(1.0)
        started = time.perf_counter()
        thread = threading.Thread(target=writer)
        thread.start()
        thread.join()
        while _pending(url):
            time.sleep(0.05)
    delays = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    while len(delays) < len(committed) and time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.5):
            if message.error() is None:
                appended_ms = message.timestamp()[1]
                delays.append(appended_ms / 1000 - committed[decode(message.value()).event_id])
    consumer.close()
    stop.set()
    return delays


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def run() -> list[BenchResult]:
    """Relay throughput, its ratio to raw produce, and latency with and without NOTIFY."""
    url = os.environ["DATABASE_URL"]
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    with temp_schema(url, "bench_relay") as schema_url, _topics(bootstrap, 5) as topics:
        relay_rate, values = _throughput(schema_url, bootstrap, topics[0])
        raw_rate = _raw_produce(bootstrap, topics[1], values)
        with temp_schema(url, "bench_relay_serial") as serial_url:
            serial_rate, _ = _throughput(serial_url, bootstrap, topics[4], overlap=False)
        notify = _latencies(schema_url, bootstrap, topics[2], listen=True)
        polling = _latencies(schema_url, bootstrap, topics[3], listen=False)
    how = f"{BACKLOG} rows, batch 1000, steady state"
    results = [
        BenchResult("relay_rows_per_s", relay_rate, "rows/s", how),
        BenchResult("raw_produce_per_s", raw_rate, "msg/s", "same envelopes, plain producer"),
        BenchResult("relay_vs_raw_produce", relay_rate / raw_rate, "x", "goal >= 0.5"),
        BenchResult(
            "relay_rows_per_s.marking_not_overlapped",
            serial_rate,
            "rows/s",
            "same, INORDER_OVERLAP_MARKING=false",
        ),
        BenchResult("relay_overlap_gain", relay_rate / serial_rate, "x", "same run"),
    ]
    for mode, delays in (("notify", notify), ("polling", polling)):
        for q in (50, 99):
            results.append(
                BenchResult(
                    f"relay_latency_p{q}_ms.{mode}",
                    _percentile(delays, q) * 1000,
                    "ms",
                    f"commit to broker append, {RATE_ROWS_S} rows/s, {len(delays)} rows"
                    + ("" if mode == "notify" else ", poll every 1 s"),
                )
            )
    return results
