"""Relay throughput and CPU against a raw producer, and commit-to-broker latency.

Relays run as their own processes (``python -m outbox_relay``), as deployed.

Throughput: the relays start on an empty outbox and split its 16 slices, then a backlog
of rows commits in one transaction, so that every relay finds its share at once (a
relay started on a filled outbox would publish alone until the next one came up and
was given slices). Timed by the broker: every topic stamps LogAppendTime, and the rate
is the rows appended after the first one over the time from the first append to the
last. CPU is read from ``/proc``: the relay processes and the PostgreSQL backends
serving them (found by ``application_name``), per 1,000 rows. The same envelopes are
then sent by a plain confluent-kafka producer with the same delivery guarantees
(idempotent, acks=all), timed the same way, for the ratio, and a fresh backlog is
published by two relays.

The plain producer sends the envelopes five times over, so that it is timed for about
as long as the relay (a second or so): sent once, its 100,000 messages took a tenth of
a second or two, a burst that measured up to 1.5 times the rate the same producer
sustained over five passes (the first pass is reported too).

Progress is asked of Kafka every 5 ms until the first row is in and every 100 ms after:
asking every 10 ms throughout (six offset requests each time) took about a third of a
core from the broker while it was being measured, and none while the plain producer was.

Latency: a writer commits 10 rows every 10 ms (1,000 rows/s); the topic stamps
LogAppendTime, and each row's commit time is PostgreSQL's commit timestamp of its
transaction. The second run does the same while another session keeps a writing
transaction open for 5 seconds at a time: only that transaction's own rows may wait.
A plain producer sending at the same rate gives the floor: produce call to append.

The third latency run puts the relay beside the leanest relay woken by NOTIFY
(``lean_relay``: one connection that listens and reads by id, no cursor, lease or
envelope), both publishing the same commits at the same time to topics of their own.
What the lean relay measures, no relay woken by NOTIFY beats on this machine at that
moment; the hypervisor's share of the CPU moves both.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TypeVar

import psycopg
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from prometheus_client.parser import text_string_to_metric_families

from producer import OutboxEvent, emit_many, migrate
from schemas import decode
from tests.benchmarks.fixtures import (
    Pipeline,
    delete_topics,
    pipeline_env,
    service_process,
    temp_schema,
)
from tests.benchmarks.machine import backends, cpu_s
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration.relay_support import PAYLOAD, free_port

BACKLOG = sized(100_000, 2_000)
RAW_PASSES = sized(5, 1)
PARTITIONS = 6
SLICES = 16
RATE_ROWS_S = 1000
LATENCY_S = sized(10.0, 2.0)
# Rows written in the first second are not measured: the relay's first send to a topic
# waits for its metadata and the first reads for their plans (steady state, not start-up).
WARM_UP_S = 1.0
LONG_TX_S = sized(5.0, 1.0)

_T = TypeVar("_T")


@contextmanager
def topics_for(bootstrap: str, count: int) -> Iterator[list[str]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    prefix = f"bench.relay.{uuid.uuid4().hex[:8]}."
    names = [f"{prefix}{i}" for i in range(count)]
    config = {"message.timestamp.type": "LogAppendTime"}
    futures = admin.create_topics([NewTopic(n, PARTITIONS, 1, config=config) for n in names])
    for future in futures.values():
        future.result(timeout=30)
    try:
        yield names
    finally:
        delete_topics(bootstrap, prefix)


def _events(
    topic: str, start: int, count: int, tag: str, *, traced: bool = False
) -> list[OutboxEvent]:
    """Rows of 1,000 entities; ``traced``: each with a trace context of its own, as emit
    writes it inside a span."""
    return [
        OutboxEvent(
            "subscription",
            f"{tag}-{i % 1000}",
            i // 1000 + 1,
            "subscription.plan_changed",
            PAYLOAD,
            topic=topic,
            headers={"traceparent": traceparent(i)} if traced else {},
        )
        for i in range(start, start + count)
    ]


def traceparent(i: int) -> str:
    """A W3C traceparent, sampled, unique to ``i``."""
    return f"00-{i + 1:032x}-{i + 1:016x}-01"


def _in_kafka(reader: Consumer, topic: str) -> int:
    return sum(
        reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        for p in range(PARTITIONS)
    )


def publish_backlog(
    url: str,
    bootstrap: str,
    topic: str,
    relays: int,
    tag: str,
    *,
    traced: bool = False,
    **env_extra: str,
) -> tuple[float, float]:
    """Rows/s of ``relays`` relays publishing one committed backlog, and CPU-ms per 1,000 rows.

    The relays start on an empty outbox and split its slices first; the backlog then
    commits in one transaction, so that every relay finds its share at the same moment.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        migrate.apply(conn)
    app = f"bench-relay-{uuid.uuid4().hex[:6]}"
    pipe = Pipeline(url, bootstrap, topic, Path())
    with ExitStack() as stack:
        processes, ports = [], []
        for _ in range(relays):
            port = free_port()
            env = pipeline_env(pipe, port, PGAPPNAME=app, INORDER_READ_ROWS="1000", **env_extra)
            processes.append(stack.enter_context(service_process("outbox_relay", env, port)))
            ports.append(port)
        deadline = time.monotonic() + 60
        while not _slices_split(ports):
            assert time.monotonic() < deadline, f"{relays} relays did not split the slices"
            time.sleep(0.2)
        with psycopg.connect(url) as conn, conn.transaction():
            for start in range(0, BACKLOG, 5000):
                emit_many(conn, _events(topic, start, 5000, tag, traced=traced))
        return timed_backlog(bootstrap, topic, {p.pid for p in processes} | backends(url, app))


def _slices_split(ports: list[int]) -> bool:
    """Every relay holds its share of the slices, and together all of them."""
    owned = []
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
        owned.append(
            sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "outbox_slices_owned"
            )
        )
    return sum(owned) == SLICES and max(owned) - min(owned) <= 1


def timed_backlog(bootstrap: str, topic: str, pids: set[int]) -> tuple[float, float]:
    """Rows/s from the first backlog row Kafka appended to the last, and CPU-ms per 1,000 rows.

    ``pids`` are the publishing processes and their PostgreSQL backends; CPU is counted
    from when the first row is in Kafka until the last is.
    """
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    while _in_kafka(reader, topic) == 0:
        time.sleep(0.005)
    cpu0 = cpu_s(pids)
    while _in_kafka(reader, topic) < BACKLOG:
        time.sleep(0.1)
    used = cpu_s(pids) - cpu0
    reader.close()
    rows, seconds = append_span(bootstrap, topic, BACKLOG)
    return rows / seconds, used * 1e6 / rows


def append_span(bootstrap: str, topic: str, count: int) -> tuple[int, float]:
    """The rows appended after the topic's first append, and the seconds to its last.

    Read from the LogAppendTime stamps of the ``count`` messages in the topic: the
    broker's own clock, with nothing asking it anything while it works.
    """
    return _span(append_stamps(bootstrap, topic, count))


def append_stamps(bootstrap: str, topic: str, count: int) -> list[int]:
    """The LogAppendTime stamps (ms) of the ``count`` messages in the topic, in order."""
    stamps = _read_all(bootstrap, topic, count, 120, lambda m: m.timestamp()[1])
    assert len(stamps) == count, f"{topic}: {len(stamps)} of {count} messages read"
    return sorted(stamps)


def _read_all(
    bootstrap: str, topic: str, count: int, wait_s: float, pick: Callable[[Message], _T | None]
) -> list[_T]:
    """``pick`` of the topic's messages from the start, until ``count`` picked or ``wait_s``.

    Messages ``pick`` maps to None are skipped.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    picked: list[_T] = []
    deadline = time.monotonic() + wait_s
    while len(picked) < count and time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.5):
            if message.error() is None and (item := pick(message)) is not None:
                picked.append(item)
    consumer.close()
    return picked


def _span(stamps: list[int]) -> tuple[int, float]:
    """Of sorted append stamps (ms): the messages after the first, and the seconds to the last.

    Stamps are whole milliseconds: messages that all land within one (a short run) count
    as the messages after the first taking that millisecond, a lower bound on their rate,
    never as no time at all.
    """
    if stamps[-1] == stamps[0]:
        return max(len(stamps) - 1, 1), 0.001
    return sum(1 for at in stamps if at > stamps[0]), (stamps[-1] - stamps[0]) / 1000


def _rate(stamps: list[int]) -> float:
    """Messages/s of sorted append stamps: those after the first, over the time to the last."""
    rows, seconds = _span(stamps)
    return rows / seconds


def _read_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    return _read_all(bootstrap, topic, count, 120, lambda m: m.value())


def _raw_produce(bootstrap: str, topic: str, values: list[bytes]) -> tuple[float, float]:
    """Messages/s a plain producer sends ``values`` at, RAW_PASSES times over, and the first pass.

    Timed like the relay, by append stamps.
    """
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
    for _ in range(RAW_PASSES):
        for key, value in zip(keys, values, strict=True):
            while True:
                try:
                    producer.produce(topic, value, key)
                    break
                except BufferError:
                    producer.poll(0.01)
    producer.flush(120)
    stamps = append_stamps(bootstrap, topic, len(values) * RAW_PASSES)
    return _rate(stamps), _rate(stamps[: len(values)])


def _write_steadily(url: str, topic: str, stop: threading.Event) -> None:
    tag = uuid.uuid4().hex[:6]
    per_tx = RATE_ROWS_S // 100
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        for tick in range(int((WARM_UP_S + LATENCY_S) * 100)):
            time.sleep(max(0.0, started + tick / 100 - time.perf_counter()))
            with conn.transaction():
                emit_many(conn, _events(topic, tick * per_tx, per_tx, tag))
    stop.set()


def _hold_long_transactions(url: str, topic: str, stop: threading.Event) -> None:
    """Keep a writing transaction open for LONG_TX_S at a time until ``stop``."""
    with psycopg.connect(url) as conn:
        round_ = 0
        while not stop.is_set():
            with conn.transaction():
                emit_many(conn, _events(topic, round_, 1, f"long-{uuid.uuid4().hex[:6]}"))
                stop.wait(LONG_TX_S)
            round_ += 1


def _latencies(
    url: str, bootstrap: str, topic: str, *, long_tx: bool = False, lean_topic: str | None = None
) -> tuple[list[float], list[float]]:
    """Commit-to-append delays (s) of the steady writer's rows: the relay's, and the lean one's.

    With ``long_tx`` a writing transaction is held open meanwhile. With ``lean_topic`` the
    lean relay publishes the same rows there, at the same time; otherwise its list is empty.
    """
    pipe = Pipeline(url, bootstrap, topic, Path())
    port = free_port()
    stop = threading.Event()
    with psycopg.connect(url, autocommit=True) as conn:
        migrate.apply(conn)
    with ExitStack() as running:
        running.enter_context(service_process("outbox_relay", pipeline_env(pipe, port), port))
        if lean_topic is not None:
            running.enter_context(_lean_relay(url, bootstrap, lean_topic))
        time.sleep(1.0)
        threads = [threading.Thread(target=_write_steadily, args=(url, topic, stop))]
        if long_tx:
            threads.append(
                threading.Thread(target=_hold_long_transactions, args=(url, topic, stop))
            )
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with psycopg.connect(url) as conn:
            committed = {
                event_id: float(at)
                for event_id, at in conn.execute(
                    "SELECT event_id, extract(epoch FROM pg_xact_commit_timestamp(xid(xid)))"
                    " FROM outbox WHERE topic = %s AND entity_id NOT LIKE 'long-%%'",
                    (topic,),
                )
            }
        measured_from = min(committed.values()) + WARM_UP_S
        measured = {e: at for e, at in committed.items() if at >= measured_from}
    relay = _appended(bootstrap, topic, measured, lambda m: decode(m.value()).event_id)
    if lean_topic is None:
        return relay, []
    return relay, _appended(bootstrap, lean_topic, measured, lambda m: (m.value() or b"").decode())


@contextmanager
def _lean_relay(url: str, bootstrap: str, topic: str) -> Iterator[None]:
    """``lean_relay`` publishing the outbox's new rows to ``topic`` until the block ends."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.benchmarks.lean_relay", url, bootstrap, topic],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != b"ready":
            raise RuntimeError("the lean relay did not start")
        yield
    finally:
        process.terminate()
        process.wait(30)


def _appended(
    bootstrap: str, topic: str, since: dict[str, float], name: Callable[[Message], str]
) -> list[float]:
    """Broker append time minus ``since[name(message)]`` (s) for every message named there."""

    def delay(message: Message) -> float | None:
        at = since.get(name(message))
        return None if at is None else message.timestamp()[1] / 1000 - at

    return _read_all(bootstrap, topic, len(since), 60, delay)


def _floor(bootstrap: str, topic: str) -> list[float]:
    """A plain producer's produce-to-append delays (s) at the same rate: what no relay beats."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 0}
    )
    producer.list_topics(topic, timeout=10)
    sent: dict[str, float] = {}
    per_tick = RATE_ROWS_S // 100
    started = time.perf_counter()
    for tick in range(int(LATENCY_S * 100)):
        time.sleep(max(0.0, started + tick / 100 - time.perf_counter()))
        for n in range(per_tick):
            key = f"{tick}-{n}"
            sent[key] = time.time()
            producer.produce(topic, b"{}", key.encode())
        producer.flush(10)
    return _appended(bootstrap, topic, sent, lambda m: (m.key() or b"").decode())


def _q(values: list[float], q: int) -> float:
    return (statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]) * 1000


def run() -> list[BenchResult]:
    """Relay throughput, CPU, its ratio to raw produce, two relays, and latency."""
    url = os.environ["DATABASE_URL"]
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    with topics_for(bootstrap, 8) as topics:
        # Latency first, while PostgreSQL has no backlog's worth of pages to write out.
        with temp_schema(url, "bench_relay_latency") as latency_url:
            steady, _ = _latencies(latency_url, bootstrap, topics[3])
            long_tx, _ = _latencies(latency_url, bootstrap, topics[4], long_tx=True)
            beside, lean = _latencies(latency_url, bootstrap, topics[6], lean_topic=topics[7])
        floor = _floor(bootstrap, topics[5])
        with temp_schema(url, "bench_relay") as one_url:
            one_rate, cpu_ms = publish_backlog(one_url, bootstrap, topics[0], 1, "tp")
        # The plain producer right after the relay it is compared with, so that the two
        # figures of the ratio see the machine as alike as they can.
        raw_rate, raw_first = _raw_produce(
            bootstrap, topics[2], _read_values(bootstrap, topics[0], BACKLOG)
        )
        with temp_schema(url, "bench_relay_two") as two_url:
            two_rate, two_cpu_ms = publish_backlog(two_url, bootstrap, topics[1], 2, "tp")
    how = f"{BACKLOG:,} rows committed at once, one relay, batch 1000, first append to last"
    results = [
        BenchResult("relay_rows_per_s", one_rate, "rows/s", how),
        BenchResult(
            "raw_produce_per_s",
            raw_rate,
            "msg/s",
            f"same envelopes, plain producer, {RAW_PASSES} passes",
        ),
        BenchResult("raw_produce_per_s.first_pass", raw_first, "msg/s", "its first 100,000"),
        BenchResult("relay_vs_raw_produce", one_rate / raw_rate, "x", "goal >= 0.15"),
        BenchResult(
            "relay_cpu_ms_per_1000_rows",
            cpu_ms,
            "ms",
            "relay + its PostgreSQL backends; goal <= 15",
        ),
        BenchResult("relay_rows_per_s.two_relays", two_rate, "rows/s", "two relay processes"),
        BenchResult("relay_cpu_ms_per_1000_rows.two_relays", two_cpu_ms, "ms", "two relays"),
        BenchResult("relay_two_vs_one", two_rate / one_rate, "x", "same run, 2 cores shared"),
    ]
    how = f"plain producer, produce call to broker append, {RATE_ROWS_S} msg/s"
    results.append(BenchResult("relay_floor_p50_ms", _q(floor, 50), "ms", how))
    results.append(BenchResult("relay_floor_p99_ms", _q(floor, 99), "ms", "same run"))
    for name, delays, goal in (("", steady, 10), ("_long_tx", long_tx, 50)):
        how = (
            f"commit to broker append, {RATE_ROWS_S} rows/s, {len(delays)} rows after "
            f"{WARM_UP_S:g} s"
        )
        if name:
            how += f", a writing transaction held open {LONG_TX_S:g} s at a time"
        results.append(BenchResult(f"relay_latency_p50_ms{name}", _q(delays, 50), "ms", how))
        results.append(
            BenchResult(f"relay_latency_p99_ms{name}", _q(delays, 99), "ms", f"goal <= {goal}")
        )
    how = "lean_relay.py: LISTEN, read by id, produce; same commits as the relay, same time"
    results += [
        BenchResult("relay_latency_p50_ms.lean_relay", _q(lean, 50), "ms", how),
        BenchResult("relay_latency_p99_ms.lean_relay", _q(lean, 99), "ms", "same run"),
        BenchResult("relay_latency_p50_ms.beside_lean", _q(beside, 50), "ms", "the relay, same"),
        BenchResult("relay_latency_p99_ms.beside_lean", _q(beside, 99), "ms", "same commits"),
        BenchResult("relay_p99_vs_lean_relay", _q(beside, 99) / _q(lean, 99), "x", "same commits"),
    ]
    return results
