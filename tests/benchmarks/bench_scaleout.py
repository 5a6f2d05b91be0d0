"""Scale-out: one, two and three consumer processes in one group, and relays sharing the outbox.

Consumers: for each count a fresh topic of 12 partitions, group and table; the
processes start and the group settles, every member assigned, before 300,000
full-state events (12,000 entities x 25 versions) are produced in one Kafka
transaction, so all of them become readable at once (consumers read committed).
Timed from the commit to the last version of every entity. CPU is read from ``/proc``: the
consumer processes and their PostgreSQL backends (by ``application_name``).

Relays: for each count a fresh outbox; the relays start and split its 16 slices
(``outbox_slices_owned`` adds up to 16 and each holds its share) before 100,000 rows
commit in one transaction. Timed by the broker, from the first row appended to the last.

All of it runs on this machine's cores, shared with Kafka and PostgreSQL: the gain
from a second process is bounded by them, so each row also gives the cores used.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from psycopg import sql

from schemas import encode
from tests.benchmarks.bench_consumer import ROUTES, VIEW, _event
from tests.benchmarks.bench_relay import (
    BACKLOG,
    publish_backlog,
    topics_for,
)
from tests.benchmarks.fixtures import (
    Pipeline,
    fresh_topic,
    pipeline_env,
    service_process,
    temp_schema,
)
from tests.benchmarks.machine import backends, cpu_s
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration.relay_support import free_port

PARTITIONS = 12
ENTITIES = sized(12_000, 600)
VERSIONS = sized(25, 5)
TOTAL = ENTITIES * VERSIONS
COUNTS = sized((1, 2, 3), (1, 2))


def _produce(bootstrap: str, topic: str) -> None:
    """Every event in one transaction: none readable until all are."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "transactional.id": f"bench-scaleout-{uuid.uuid4().hex[:8]}",
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for version in range(1, VERSIONS + 1):
        for entity in range(ENTITIES):
            event = _event(entity, version)
            while True:
                try:
                    producer.produce(topic, encode(event), event.key)
                    break
                except BufferError:
                    producer.poll(0.05)
    producer.commit_transaction(120)


def _applied(url: str, table: str) -> int:
    """Events applied so far: in-order versions from 1, so the sum of the rows' seqs."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            sql.SQL("SELECT coalesce(sum(seq), 0) FROM {}").format(sql.Identifier(table))
        ).fetchone()
    return int(row[0]) if row else 0


def _settled(admin: AdminClient, group: str, members: int) -> bool:
    [future] = admin.describe_consumer_groups([group]).values()
    described = future.result(timeout=10)
    assigned = [m for m in described.members if m.assignment.topic_partitions]
    return len(described.members) == members and len(assigned) == members


def _consumers(
    url: str, bootstrap: str, topic: str, folder: Path, count: int
) -> tuple[float, float]:
    """Events/s with ``count`` consumer processes in one group, and the cores they used."""
    table = f"scaleout_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(VIEW).format(sql.Identifier(table)))
    routes = folder / f"{table}.toml"
    routes.write_text(ROUTES.format(table=table))
    group, app = f"bench-{table}", f"bench-{table}"
    pipe = Pipeline(url, bootstrap, topic, folder)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    with ExitStack() as stack:
        processes = []
        for _ in range(count):
            port = free_port()
            env = pipeline_env(
                pipe,
                port,
                PGAPPNAME=app,
                INORDER_ROUTES_FILE=str(routes),
                INORDER_TOPICS=f'["{topic}"]',
                INORDER_GROUP_ID=group,
                INORDER_CREATE_TOPICS="false",
                INORDER_DEAD_LETTER_TOPIC=f"{topic}.dlq",
            )
            processes.append(stack.enter_context(service_process("consumer", env, port)))
        deadline = time.monotonic() + 60
        while not _settled(admin, group, count):
            assert time.monotonic() < deadline, f"{count} consumers did not settle"
            time.sleep(0.2)
        _produce(bootstrap, topic)
        pids = {p.pid for p in processes} | backends(url, app)
        cpu0, started = cpu_s(pids), time.perf_counter()
        while _applied(url, table) < TOTAL:
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        cpu = cpu_s(pids) - cpu0
    return TOTAL / elapsed, cpu / elapsed


def _versus_one(what: str, rates: dict[int, float]) -> list[BenchResult]:
    """Each count's rate against one process's, measured in the same run."""
    return [
        BenchResult(f"scaleout_{what}_{count}_vs_1", rates[count] / rates[1], "x", "same run")
        for count in COUNTS[1:]
    ]


def run() -> list[BenchResult]:
    """Events/s and cores used by 1, 2 and 3 consumers; rows/s of 1, 2 and 3 relays."""
    url = os.environ["DATABASE_URL"]
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    results: list[BenchResult] = []
    rates: dict[int, float] = {}
    with (
        temp_schema(url, "bench_scaleout") as schema_url,
        tempfile.TemporaryDirectory() as workdir,
    ):
        for count in COUNTS:
            with fresh_topic(bootstrap, "bench.scaleout.", PARTITIONS) as topic:
                rate, cores = _consumers(schema_url, bootstrap, topic, Path(workdir), count)
            rates[count] = rate
            how = f"{count} consumer process(es), one group, {PARTITIONS} partitions"
            results.append(BenchResult(f"scaleout_consumers_{count}_per_s", rate, "events/s", how))
            results.append(
                BenchResult(
                    f"scaleout_consumers_{count}_cores",
                    cores,
                    "cores",
                    "consumers + their PostgreSQL backends, CPU s per s",
                )
            )
    results += _versus_one("consumers", rates)
    relay_rates: dict[int, float] = {}
    with topics_for(bootstrap, len(COUNTS)) as topics:
        for count, topic in zip(COUNTS, topics, strict=True):
            with temp_schema(url, "bench_scaleout_relay") as relay_url:
                rate, cpu_ms = publish_backlog(relay_url, bootstrap, topic, count, "so")
            relay_rates[count] = rate
            how = f"{count} relay process(es) sharing the outbox's slices, {BACKLOG:,} rows"
            results.append(BenchResult(f"scaleout_relays_{count}_per_s", rate, "rows/s", how))
            results.append(
                BenchResult(
                    f"scaleout_relays_{count}_cpu_ms_per_1000_rows",
                    cpu_ms,
                    "ms",
                    "relays + their PostgreSQL backends",
                )
            )
    results += _versus_one("relays", relay_rates)
    return results
