"""Commit to visible at steady rates, parked-event waits, and the floor, all in one run.

A relay and a consumer run as their own processes on a fresh schema and topic (the
example routes: subscriptions to a projection, seat ledgers to a step route). After
3 s of the example stream as a warm-up (nothing measured), a writer commits new
subscriptions at 100, 1,000 and 10,000 events/s and as fast as it
goes; then the example service's stream at 1,000 events/s (each new subscription is a
projection event and a step event, as in the demo), the headline figures; then 1,000
step events/s alone. Every time is a PostgreSQL commit timestamp
(``track_commit_timestamp``): the writer's transaction against the consumer's
transaction that wrote the row, both on the server's clock.

Then, on the same processes, 100 seat ledgers arrive with their second event 50 ms
before the first (produced straight to the topic): how long the early event stays
parked, and how soon after its predecessor arrives it is applied. The headline run is
repeated with ``INORDER_POLL_LINGER_MS=100`` (each batch waits up to 100 ms to fill,
as batches did before they became adaptive). The floor is a plain produce-to-consume
round trip on the same broker plus a plain one-row PostgreSQL commit.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from consumer import examples
from consumer.testing import event
from producer import OutboxEvent, emit_many, migrate
from schemas import Event, encode
from tests.benchmarks.fixtures import (
    Pipeline,
    delete_topics,
    pipeline_env,
    service_process,
    temp_schema,
)
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration.relay_support import PAYLOAD, free_port
from tests.support.services import ROOT

PLOT = ROOT / "bench-latency.png"
# Offered rate (events/s, None: as fast as the writer commits) and seconds at it.
RATES: tuple[tuple[int | None, float], ...] = sized(
    ((100, 5), (1000, 10), (10_000, 5), (None, 5)), ((100, 1), (1000, 1), (None, 1))
)
TICK_S = 0.01
FLAT_OUT_EVENTS_PER_TX = 1000
EARLY = sized(100, 10)
EARLY_LEAD_S = 0.05
FLOOR_SAMPLES = sized(300, 20)
# Both routes at work for this long before anything is measured: steady state, not start-up.
WARM_UP_S = sized(3.0, 0.5)


@dataclass(frozen=True, slots=True)
class Run:
    """One steady-rate run: delays (s) per route, and the rate reached."""

    offered: int | None
    projection: list[float]
    steps: list[float]
    reached: float


def _q(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 1 else values[0]


# ---------------------------------------------------------------- the processes


@contextmanager
def _relay(pipe: Pipeline) -> Iterator[None]:
    port = free_port()
    with service_process("outbox_relay", pipeline_env(pipe, port), port):
        yield


@contextmanager
def _consumer(pipe: Pipeline, **extra: str) -> Iterator[None]:
    port = free_port()
    env = pipeline_env(
        pipe,
        port,
        REDIS_URL=os.environ["REDIS_URL"],
        INORDER_ROUTES_FILE=str(pipe.folder / "routes.toml"),
        INORDER_TOPICS=f'["{pipe.topic}"]',
        INORDER_DEAD_LETTER_TOPIC=f"{pipe.topic}.dlq",
        INORDER_HELD_TOPIC=f"{pipe.topic}.held",
        # One group: a consumer started later carries on from the committed offsets.
        INORDER_GROUP_ID=f"{pipe.topic}.consumer",
        INORDER_REDIS_KEY_PREFIX=pipe.topic,
        **extra,
    )
    with service_process("consumer", env, port):
        yield


# ---------------------------------------------------------------- steady-rate runs


# Which routes a run's events go to: every event, or every other one, a step.
MIXES = {"projection": 0, "step": 1, "mixed": 2}


def _events(pipe: Pipeline, tag: str, start: int, count: int, mix: str) -> list[OutboxEvent]:
    every = MIXES[mix]
    step = ("seat_ledger", "seat_ledger.opened", {"seats": 1})
    projection = ("subscription", "subscription.plan_changed", PAYLOAD)
    out = []
    for n in range(start, start + count):
        stream, event_type, payload = step if every and n % every == 0 else projection
        out.append(OutboxEvent(stream, f"{tag}-{n}", 1, event_type, payload, topic=pipe.topic))
    return out


def _write(
    pipe: Pipeline, tag: str, rate: int | None, seconds: float, mix: str
) -> tuple[list[int], int]:
    """Commit new entities at ``rate``; the writer's transaction ids and the events written."""
    per_tx = FLAT_OUT_EVENTS_PER_TX if rate is None else max(1, round(rate * TICK_S))
    every_s = 0.0 if rate is None else per_tx / rate
    xids: list[int] = []
    written = 0
    with psycopg.connect(pipe.url) as conn:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            due = started + len(xids) * every_s
            time.sleep(max(0.0, due - time.perf_counter()))
            with conn.transaction():
                emit_many(conn, _events(pipe, tag, written, per_tx, mix))
                row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
            xids.append(int(row[0]) if row else 0)
            written += per_tx
    return xids, written


VISIBLE = """
SELECT e.entity, e.route,
       extract(epoch FROM pg_xact_commit_timestamp(e.row_xmin))
FROM (
    SELECT subscription_id AS entity, 'projection' AS route, xmin AS row_xmin
    FROM billing_view WHERE subscription_id LIKE %(tag)s
    UNION ALL
    SELECT subscription_id, 'step', xmin FROM seat_totals WHERE subscription_id LIKE %(tag)s
) e
"""
COMMITTED = """
SELECT extract(epoch FROM pg_xact_commit_timestamp(xid(x)))
FROM unnest(%s::text[]::xid8[]) WITH ORDINALITY AS t(x, n) ORDER BY n
"""


def _measure(pipe: Pipeline, rate: int | None, seconds: float, mix: str = "projection") -> Run:
    tag = f"r{rate or 'max'}-{uuid.uuid4().hex[:4]}"
    xids, written = _write(pipe, tag, rate, seconds, mix)
    per_tx = written // len(xids)
    deadline = time.monotonic() + 300
    with psycopg.connect(pipe.url, autocommit=True) as conn:
        while True:
            rows = conn.execute(VISIBLE, {"tag": f"{tag}-%"}).fetchall()
            if len(rows) == written:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(rows)} of {written} events visible after 300 s")
            time.sleep(0.2)
        committed = [
            float(row[0]) if row[0] is not None else 0.0
            for row in conn.execute(COMMITTED, ([str(x) for x in xids],)).fetchall()
        ]
    delays: dict[str, list[float]] = {"projection": [], "step": []}
    last = 0.0
    for entity, route, seen in rows:
        n = int(entity.rsplit("-", 1)[1])
        delays[route].append(float(seen) - committed[n // per_tx])
        last = max(last, float(seen))
    reached = written / (last - committed[0])
    return Run(rate, delays["projection"], delays["step"], reached)


# ---------------------------------------------------------------- early arrivals


def _early_arrivals(pipe: Pipeline) -> tuple[list[float], list[float]]:
    """Seconds each early event stayed parked, and from its predecessor's arrival to applied."""
    producer = Producer({"bootstrap.servers": pipe.bootstrap, "acks": "all", "linger.ms": 0})
    tag = f"early-{uuid.uuid4().hex[:4]}"

    def send(one: Event) -> float:
        producer.produce(pipe.topic, encode(one), one.key)
        producer.flush(10)
        return time.time()

    sent: dict[str, tuple[float, float]] = {}
    for n in range(EARLY):
        entity = f"{tag}-{n}"
        parked_at = send(event(entity, 2, "seat_ledger.seats_added", {"count": 1}))
        time.sleep(EARLY_LEAD_S)
        sent[entity] = (parked_at, send(event(entity, 1, "seat_ledger.opened", {"seats": 1})))
    query = (
        "SELECT subscription_id, extract(epoch FROM pg_xact_commit_timestamp(xmin)) "
        "FROM seat_totals WHERE subscription_id LIKE %s AND seats = 2"
    )
    deadline = time.monotonic() + 60
    with psycopg.connect(pipe.url, autocommit=True) as conn:
        while len(rows := conn.execute(query, (f"{tag}-%",)).fetchall()) < EARLY:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(rows)} of {EARLY} early events applied after 60 s")
            time.sleep(0.1)
    parked = [float(seen) - sent[e][0] for e, seen in rows]
    after = [float(seen) - sent[e][1] for e, seen in rows]
    return parked, after


# ---------------------------------------------------------------- the floor


def _kafka_round_trips(bootstrap: str, topic: str) -> list[float]:
    """Produce one message (acks=all), consume it, repeat: the broker's round trip."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "latest",
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.subscribe([topic])
    while not consumer.assignment():
        consumer.consume(1, 0.2)
    time.sleep(1.0)  # the assignment's first fetch has started
    trips = []
    for _ in range(FLOOR_SAMPLES):
        started = time.perf_counter()
        producer.produce(topic, b"ping")
        producer.poll(0)
        while not [m for m in consumer.consume(1, 5) if m.error() is None]:
            if time.perf_counter() - started > 30:
                raise RuntimeError("a produced message was not consumed within 30 s")
        trips.append(time.perf_counter() - started)
    consumer.close()
    producer.flush(10)
    return trips


def _postgres_commits(url: str) -> list[float]:
    """Insert one row and commit, repeated: one PostgreSQL commit."""
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE floor_probe (n integer)")
        conn.commit()
        times = []
        for n in range(FLOOR_SAMPLES):
            started = time.perf_counter()
            conn.execute("INSERT INTO floor_probe VALUES (%s)", (n,))
            conn.commit()
            times.append(time.perf_counter() - started)
    return times


# ---------------------------------------------------------------- report


@dataclass(frozen=True, slots=True)
class Measured:
    """Everything one run of the suite measured."""

    runs: list[Run]
    steps: Run
    mixed: Run
    fixed: Run
    parked: list[float]
    after: list[float]
    kafka: list[float]
    commits: list[float]

    @property
    def floor_ms(self) -> float:
        """The floor: Kafka round trip p50 plus PostgreSQL commit p50."""
        return _q(self.kafka, 50) + _q(self.commits, 50)


def _plot(m: Measured) -> None:
    import matplotlib  # noqa: PLC0415 - a bench-only extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    runs, mixed, fixed = m.runs, m.mixed, m.fixed
    reached = [r.reached for r in runs]
    labels = [f"{r.offered:,}" if r.offered else "flat out" for r in runs]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for q, style in ((50, "-"), (99, "--")):
        left.plot(
            reached,
            [_q(r.projection, q) for r in runs],
            style,
            marker="o",
            label=f"projection p{q}",
        )
        left.plot(
            [mixed.reached],
            [_q(mixed.steps, q)],
            marker="s",
            linestyle="none",
            label=f"step route p{q} (half of 1,000/s)",
        )
    left.plot(
        [fixed.reached, fixed.reached],
        [_q(fixed.projection, 50), _q(fixed.projection, 99)],
        marker="x",
        linestyle="none",
        color="black",
        label="projection p50, p99 with a 100 ms batch wait",
    )
    left.axhline(m.floor_ms, color="grey", linestyle=":", label="floor p50 (Kafka + PostgreSQL)")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("events/s reached")
    left.set_ylabel("commit to visible, ms")
    left.set_title("Latency against load")
    left.legend(fontsize=8)
    right.bar(labels, reached)
    right.set_xlabel("offered events/s")
    right.set_ylabel("events/s reached")
    right.set_title("Throughput reached (projection)")
    figure.tight_layout()
    figure.savefig(PLOT, dpi=110)
    plt.close(figure)


def _results(m: Measured) -> list[BenchResult]:
    floor = m.floor_ms
    at_1000 = next(r for r in m.runs if r.offered == 1000)
    mixed = "1,000 events/s: new subscriptions, each a projection and a step event"
    out = [
        BenchResult(
            "e2e_latency_p50_ms",
            _q(m.mixed.projection, 50),
            "ms",
            f"outbox commit to projection row committed; {mixed}; goal <= 10",
        ),
        BenchResult("e2e_latency_p99_ms", _q(m.mixed.projection, 99), "ms", "same run; goal <= 40"),
        BenchResult(
            "e2e_step_latency_p50_ms",
            _q(m.mixed.steps, 50),
            "ms",
            "outbox commit to step applied, same run",
        ),
        BenchResult("e2e_step_latency_p99_ms", _q(m.mixed.steps, 99), "ms", "same run; goal <= 50"),
        BenchResult(
            "e2e_projection_only_latency_p50_ms",
            _q(at_1000.projection, 50),
            "ms",
            "1,000 projection events/s",
        ),
        BenchResult("e2e_projection_only_latency_p99_ms", _q(at_1000.projection, 99), "ms", "same"),
        BenchResult(
            "e2e_step_only_latency_p50_ms",
            _q(m.steps.steps, 50),
            "ms",
            "1,000 step events/s (each a new seat ledger)",
        ),
        BenchResult("e2e_step_only_latency_p99_ms", _q(m.steps.steps, 99), "ms", "same"),
        BenchResult(
            "e2e_floor_p50_ms", floor, "ms", "Kafka round trip p50 + PostgreSQL commit p50"
        ),
        BenchResult(
            "e2e_floor_kafka_p50_ms", _q(m.kafka, 50), "ms", "plain produce (acks=all) to consume"
        ),
        BenchResult(
            "e2e_floor_postgres_p50_ms", _q(m.commits, 50), "ms", "one-row insert and commit"
        ),
        BenchResult(
            "e2e_latency_p50_vs_floor", _q(m.mixed.projection, 50) / floor, "x", "same run"
        ),
        BenchResult(
            "e2e_latency_p50_ms.fixed_wait",
            _q(m.fixed.projection, 50),
            "ms",
            "the same stream, INORDER_POLL_LINGER_MS=100",
        ),
        BenchResult("e2e_latency_p99_ms.fixed_wait", _q(m.fixed.projection, 99), "ms", "same"),
        BenchResult("e2e_step_latency_p99_ms.fixed_wait", _q(m.fixed.steps, 99), "ms", "same"),
        BenchResult(
            "e2e_park_wait_p50_ms",
            _q(m.parked, 50),
            "ms",
            f"early event parked to applied; predecessor {EARLY_LEAD_S * 1000:.0f} ms later",
        ),
        BenchResult(
            "e2e_park_drain_p99_ms",
            _q(m.after, 99),
            "ms",
            "predecessor produced to early event applied",
        ),
    ]
    for run in m.runs:
        name = f"{run.offered}" if run.offered else "flat_out"
        out += [
            BenchResult(
                f"load.{name}.reached_per_s",
                run.reached,
                "events/s",
                "projection; first commit to last visible",
            ),
            BenchResult(f"load.{name}.p50_ms", _q(run.projection, 50), "ms", "commit to visible"),
            BenchResult(f"load.{name}.p99_ms", _q(run.projection, 99), "ms", "commit to visible"),
        ]
    return out


def run() -> list[BenchResult]:
    """Latency at steady rates and against the floor; writes the plot."""
    url, bootstrap = os.environ["DATABASE_URL"], os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW track_commit_timestamp").fetchone()
    if not row or row[0] != "on":
        raise SystemExit(
            "the latency benchmark needs track_commit_timestamp=on: "
            "deploy/local/stack restart postgres"
        )
    topic = f"bench.latency.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [topic, f"{topic}.floor"]
    for future in admin.create_topics([NewTopic(topic, 6, 1), NewTopic(names[1], 1, 1)]).values():
        future.result(timeout=30)
    try:
        with temp_schema(url, "bench_latency") as schema_url, tempfile.TemporaryDirectory() as d:
            pipe = Pipeline(schema_url, bootstrap, topic, Path(d))
            (pipe.folder / "routes.toml").write_text(
                examples.PROJECTION_ROUTE + examples.STEP_ROUTE
            )
            with psycopg.connect(schema_url, autocommit=True) as conn:
                migrate.apply(conn)
                conn.execute(examples.BILLING_VIEW)
                conn.execute(examples.SEAT_TABLES)
            kafka = _kafka_round_trips(bootstrap, names[1])
            commits = _postgres_commits(schema_url)
            with _relay(pipe):
                with _consumer(pipe):
                    _measure(pipe, 1000, WARM_UP_S, "mixed")  # connections, plans, group
                    runs = [_measure(pipe, rate, seconds) for rate, seconds in RATES]
                    mixed = _measure(pipe, 1000, 15, "mixed")
                    steps = _measure(pipe, 1000, 10, "step")
                    parked, after = _early_arrivals(pipe)
                with _consumer(pipe, INORDER_POLL_LINGER_MS="100"):
                    fixed = _measure(pipe, 1000, 15, "mixed")
    finally:
        delete_topics(bootstrap, topic)
    measured = Measured(runs, steps, mixed, fixed, parked, after, kafka, commits)
    _plot(measured)
    print(f"plot written to {PLOT}")
    return _results(measured)
