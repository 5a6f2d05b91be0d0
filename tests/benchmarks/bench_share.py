"""Twelve consumers on three partitions: a consumer group against a share group.

A consumer group gives each partition to one member, so of twelve members on three
partitions three work and nine wait. A share group hands records of every partition to
every member. Two workloads, each on a fresh topic of three partitions, with twelve
consumer processes started and settled before the events are produced:

- steps whose handler waits 50 ms in the step's transaction (a slow call inside
  PostgreSQL's work): the workload where members beyond the partition count matter;
- projections (full-state events, 25 versions per entity, shuffled): bound by the
  machine's two cores, shared with Kafka and PostgreSQL.

Share members take 10 records per poll for the steps and 500 for the projections
(``INORDER_SHARE_MAX_POLL_RECORDS``). The events are produced one per produced batch: a
share group hands out records by the batch they were produced in, so batching decides
how widely they spread (the relay sends what it has read at once). Share members get
one heartbeat round to learn their partitions before the events are produced. Timed
from the first event produced to the last applied.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from subprocess import DEVNULL, Popen

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from psycopg import sql

from schemas import Event, encode
from tests.benchmarks import bench_consumer, bench_steps
from tests.benchmarks.fixtures import Pipeline, fresh_topic, pipeline_env, temp_schema
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration.relay_support import free_port

MEMBERS = sized(12, 6)
PARTITIONS = 3
STEP_ENTITIES = sized(1_200, 150)
PROJECTION_ENTITIES = sized(2_000, 200)
VERSIONS = sized(25, 5)
SHARE_SETTLE_S = 7.0
STEP_ROUTES = """[[route]]
stream = "ledger"
kind = "step"
[route.handlers]
"ledger.added" = "tests.integration.step_handlers:slow_call"
"""


def _produce(bootstrap: str, topic: str, events: list[Event]) -> None:
    """Each event in a produced batch of its own."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for event in events:
        while True:
            try:
                producer.produce(topic, encode(event), event.key)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(120)


@dataclass(frozen=True)
class Workload:
    """What the members apply, and how to tell it is all applied."""

    routes: str
    events: list[Event]
    done: sql.Composed | sql.SQL
    total: int
    # Records a share member takes per poll: few spread slow work, many cut the cost
    # per batch of fast work.
    poll_records: int


def _count(url: str, query: sql.Composed | sql.SQL) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _assigned(admin: AdminClient, group: str) -> tuple[int, int]:
    """Members of a consumer group, and how many of them hold partitions."""
    [future] = admin.describe_consumer_groups([group]).values()
    described = future.result(timeout=10)
    return len(described.members), sum(
        1 for m in described.members if m.assignment.topic_partitions
    )


def _up(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def _members(env: dict[str, str], count: int) -> Iterator[list[tuple[Popen[bytes], int]]]:
    """``count`` consumer processes, alive until the block ends; then stopped all at once.

    One by one, each member's leaving set the group rebalancing again while the next was
    closing, and a close waits for the rebalance: together, the group settles once.
    """
    started: list[tuple[Popen[bytes], int]] = []

    def stop_all() -> None:
        for process, _ in started:
            process.terminate()
        for process, _ in started:
            process.wait(60)

    with ExitStack() as stack:
        stack.callback(stop_all)
        for _ in range(count):
            port = free_port()
            process = Popen(
                [sys.executable, "-m", "consumer"],
                env={**env, "INORDER_HTTP_PORT": str(port)},
                stdout=DEVNULL,
            )
            started.append((process, port))
        yield started


def _wait(what: str, check: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:g}s")
        time.sleep(0.2)


def _rate(url: str, bootstrap: str, folder: Path, mode: str, work: Workload) -> float:
    """Events/s of the members in ``mode`` (group or share) until all of ``work`` is applied."""
    with fresh_topic(bootstrap, "bench.share.", PARTITIONS) as topic:
        group = f"bench-share-{uuid.uuid4().hex[:8]}"
        routes_file = folder / f"{group}.toml"
        routes_file.write_text(work.routes)
        env = pipeline_env(
            Pipeline(url, bootstrap, topic, folder),
            0,
            INORDER_ROUTES_FILE=str(routes_file),
            INORDER_TOPICS=f'["{topic}"]',
            INORDER_GROUP_ID=group,
            INORDER_CREATE_TOPICS="false",
            INORDER_DEAD_LETTER_TOPIC=f"{topic}.dlq",
            INORDER_CONSUMER_MODE=mode,
            INORDER_SHARE_MAX_POLL_RECORDS=str(work.poll_records),
        )
        admin = AdminClient({"bootstrap.servers": bootstrap})
        with _members(env, MEMBERS) as members:
            if mode == "share":
                _wait("members ready", lambda: all(_up(p, "/readyz") for _, p in members))
                # A share member learns its partitions from its heartbeats (every 5 s by
                # default), and the client tells no assignment: give them one round.
                time.sleep(SHARE_SETTLE_S)
            else:
                _wait("group settled", lambda: _assigned(admin, group) == (MEMBERS, PARTITIONS))
            started = time.perf_counter()
            _produce(bootstrap, topic, work.events)
            _wait("events applied", lambda: _count(url, work.done) >= work.total, timeout=900)
            return len(work.events) / (time.perf_counter() - started)


def run() -> list[BenchResult]:
    """Steps/s and projected events/s of twelve members, group against share."""
    url = os.environ["DATABASE_URL"]
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    steps = [bench_steps._event(e, 1) for e in range(STEP_ENTITIES)]
    rng = random.Random(7)
    versions = [
        bench_consumer._event(e, v)
        for e in range(PROJECTION_ENTITIES)
        for v in range(1, VERSIONS + 1)
    ]
    rng.shuffle(versions)
    rates: dict[tuple[str, str], float] = {}
    with temp_schema(url, "bench_share") as schema_url, tempfile.TemporaryDirectory() as folder:
        for mode in ("group", "share"):
            bench_steps._fresh_tables(schema_url)
            stepping = Workload(
                STEP_ROUTES, steps, sql.SQL("SELECT count(*) FROM applied_steps"), STEP_ENTITIES, 10
            )
            rates[("steps", mode)] = _rate(schema_url, bootstrap, Path(folder), mode, stepping)
            table = f"share_{mode}_{uuid.uuid4().hex[:6]}"
            with psycopg.connect(schema_url, autocommit=True) as conn:
                conn.execute(sql.SQL(bench_consumer.VIEW).format(sql.Identifier(table)))
            projecting = Workload(
                bench_consumer.ROUTES.format(table=table),
                versions,
                sql.SQL("SELECT sum(seq) FROM {}").format(sql.Identifier(table)),
                PROJECTION_ENTITIES * VERSIONS,
                500,
            )
            rates[("projection", mode)] = _rate(
                schema_url, bootstrap, Path(folder), mode, projecting
            )
    how = f"{MEMBERS} consumer processes, {PARTITIONS} partitions"
    results = []
    for (workload, mode), rate in rates.items():
        unit = "steps/s" if workload == "steps" else "events/s"
        results.append(BenchResult(f"share_{workload}_{mode}_per_s", rate, unit, how))
    results += [
        BenchResult(
            "share_vs_classic",
            rates[("steps", "share")] / rates[("steps", "group")],
            "x",
            f"steps waiting 50 ms, {STEP_ENTITIES:,} entities; goal >= 3",
        ),
        BenchResult(
            "share_vs_classic_projection",
            rates[("projection", "share")] / rates[("projection", "group")],
            "x",
            f"{PROJECTION_ENTITIES:,} entities x {VERSIONS} versions, shuffled; goal >= 0.8",
        ),
    ]
    return results
