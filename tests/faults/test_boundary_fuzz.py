"""The boundary fuzzer: every boundary fed schema-drawn inputs pushed to the edges, under load.

For each boundary (events to the consumers, outbox rows to the relays, republish
requests to the relays, republish results to the sweepers, routes files to a starting
consumer) the inputs come from ``boundary_inputs``. The processes run as their console
scripts, two of each, beside the load generator; a probe changes one entity every
second through the outbox, and a change not applied within 5 s is a stall. The judge
counts, per boundary: inputs tried, refused with a reason, taken, process exits and
stalls. Exits and stalls must be 0, and every input must be accounted for by the
processes' own counters. The table ends the fault report.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from producer import subscriptions as subs
from tests.conftest import PgSchema, TopicFactory
from tests.faults import accounting, boundary_inputs, effects, oracle, oracle_rows
from tests.faults.accounting import Place
from tests.faults.conftest import BOUNDARIES, Boundary, Scale
from tests.faults.pipeline import Pipeline
from tests.faults.test_faults import start
from tests.integration.sweeper_support import tool
from tests.support.services import ROOT, Services

pytestmark = [pytest.mark.faults, pytest.mark.services, pytest.mark.timeout(1800)]

STALL_S = 5.0
SETTLE_S = 30.0  # longest wait for a retried step's effect to show
CONSUMERS = ("consumer-1", "consumer-2")
RELAYS = ("relay-1", "relay-2")
SWEEPERS = ("sweeper-1", "sweeper-2")
# Inputs sent between two looks at the processes.
CHUNK = 250


def by_label(pipeline: Pipeline, names: tuple[str, ...], sample: str, label: str) -> Counter[str]:
    """One sample of several processes' /metrics, summed per value of one label."""
    found = Counter[str]()
    for labels, value in pipeline.samples(names, sample):
        found[labels.get(label, "")] += int(value)
    return found


@dataclass
class Probe:
    """Changes one entity every second through the outbox and times each change's arrival."""

    pipeline: Pipeline
    entity: str = field(default_factory=lambda: f"probe-{uuid.uuid4().hex[:6]}")
    latencies: list[float] = field(default_factory=list)
    stalls: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Probe:
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(90)

    def p99(self) -> float:
        """The 99th percentile of the probe's latencies, in seconds."""
        ordered = sorted(self.latencies) or [0.0]
        return round(ordered[int(len(ordered) * 0.99)], 2)

    def _run(self) -> None:
        plans = list(subs.PLAN_PRICES_CENTS)
        topic = self.pipeline.events_topic
        with psycopg.connect(self.pipeline.db.url, autocommit=True) as conn:
            subs.create_subscription(conn, self.entity, plans[0], topic=topic)
            i = 0
            while not self._stop.is_set():
                i += 1
                version = subs.change_plan(conn, self.entity, plans[i % len(plans)], topic=topic)
                self._wait_applied(conn, version.seq, time.monotonic())
                self._stop.wait(1.0)

    def _wait_applied(self, conn: psycopg.Connection[Any], seq: int, written: float) -> None:
        # Waited for even once stopping: a change still in flight then is the last one timed.
        while True:
            row = conn.execute(
                "SELECT seq FROM billing_view WHERE subscription_id = %s", (self.entity,)
            ).fetchone()
            waited = time.monotonic() - written
            if row is not None and row[0] >= seq:
                self.latencies.append(waited)
                self.stalls += waited > STALL_S
                return
            if waited > 60:
                self.stalls += 1
                return
            time.sleep(0.1)


@pytest.fixture
def fuzz_pipeline(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> Iterator[Pipeline]:
    """A pipeline with a batch route too, and a topic of its own for fuzzed events."""
    routes = effects.ROUTES + (
        f'\n[[route]]\nstream = "batch"\nkind = "batch"\noutput_topic = '
        f'"{topic_factory("batch-output")}"\nwork_topic = "{topic_factory("batch-work")}"\n'
    )
    made = Pipeline(pg_schema, services, topic_factory, tmp_path, routes=routes)
    made.env["INORDER_FUZZ_TOPIC"] = topic_factory("fuzz", partitions=6)
    made.env["INORDER_TOPICS"] = json.dumps([made.events_topic, made.env["INORDER_FUZZ_TOPIC"]])
    made.env["INORDER_UNKNOWN_TOPIC_GRACE_S"] = "0"
    yield made
    made.close()


def _under_load(pipeline: Pipeline, name: str, feed: Callable[[], None]) -> Boundary:
    """Start two of each process, load them, probe them, ``feed`` the inputs; a table row."""
    start(pipeline, *RELAYS, *CONSUMERS, *SWEEPERS)
    boundary = Boundary(name)
    started = time.monotonic()
    load = pipeline.load(20, 15, 40, seed=3)
    with Probe(pipeline) as probe:
        feed()
        time.sleep(STALL_S)  # the probe's changes after the last input count too
    load.join()
    boundary.exits = len(pipeline.crashed())
    boundary.stalls = probe.stalls
    boundary.probe_p99_s = probe.p99()
    boundary.seconds = round(time.monotonic() - started, 1)
    BOUNDARIES.append(boundary)
    return boundary


def _send(pipeline: Pipeline, topic: str, values: list[bytes]) -> list[Place]:
    """Produce raw values as a client that is not ours, in chunks, checking on the processes.

    Returns where each value was written, from the delivery reports.
    """
    producer = Producer(
        {"bootstrap.servers": pipeline.services.kafka_bootstrap, "message.max.bytes": 5_000_000}
    )
    places: list[Place | None] = [None] * len(values)

    def delivered(index: int) -> Callable[[Any, Any], None]:
        def report(error: Any, message: Any) -> None:
            assert error is None, f"input {index} was not written: {error}"
            places[index] = (message.topic(), message.partition(), message.offset())

        return report

    for i in range(0, len(values), CHUNK):
        for n, value in enumerate(values[i : i + CHUNK]):
            key = f"seat_ledger:fz-{i + n}".encode()
            producer.produce(topic, value, key, on_delivery=delivered(i + n))
            producer.poll(0)
        assert producer.flush(60) == 0
        assert not pipeline.crashed(), f"{pipeline.crashed()} exited; logs {pipeline.logs}"
        time.sleep(0.1)
    assert None not in places, "a delivery report never came"
    return [p for p in places if p is not None]


def _judge(boundary: Boundary) -> None:
    """No exit, no stall, every input accounted for: refused with a reason or taken.

    Kafka-fed protocol topics are read at least once: a message acted on when a commit
    failed (a rebalance) is read again after the rewind, so it may be counted twice.
    """
    assert boundary.exits == 0, f"{boundary.name}: {boundary.exits} process exits"
    assert boundary.stalls == 0, f"{boundary.name}: {boundary.stalls} stalls over {STALL_S}s"
    accounted = boundary.taken + sum(boundary.refused.values())
    assert accounted >= boundary.tried, f"{boundary.name}: {accounted} of {boundary.tried}"
    boundary.redelivered = accounted - boundary.tried
    assert boundary.redelivered <= boundary.tried // 20, f"{boundary.name}: too many again"
    assert "" not in boundary.refused, "a refusal without a reason"
    assert boundary.unaccounted == 0, (
        f"{boundary.name}: {boundary.unaccounted} inputs not as expected, e.g. {boundary.examples}"
    )


def test_events_at_the_edges_stop_no_consumer(fuzz_pipeline: Pipeline, scale: Scale) -> None:
    """Envelopes of every routed stream, pushed to the edges: each has the outcome expected."""
    pipeline = fuzz_pipeline
    fuzz = pipeline.env["INORDER_FUZZ_TOPIC"]
    streams = {"subscription": "", "seat_ledger": "", "batch": ""}
    inputs = boundary_inputs.envelopes(scale.boundary_inputs, streams, seed=36)
    expected = [
        (what, oracle.event(raw, unchanged=what.endswith(": valid"))) for what, raw in inputs
    ]
    places: list[Place] = []

    def feed() -> None:
        places.extend(_send(pipeline, fuzz, [raw for _, raw in inputs]))
        pipeline.wait_for("every input handled", lambda: pipeline.lag(fuzz) == 0, timeout=600)

    boundary = _under_load(pipeline, "events (consumers)", feed)
    dead = accounting.letters(
        pipeline.services.kafka_bootstrap, pipeline.env["INORDER_DEAD_LETTER_TOPIC"]
    )
    wanted = {_entity(inputs[i][1]) for i, (_, expect) in enumerate(expected) if expect.applied}
    shown = _effects(pipeline, wanted)
    accounting.account(boundary, expected, places, dead, lambda i: _entity(inputs[i][1]) in shown)
    boundary.examples.extend(_step_states(pipeline, sorted(wanted - shown)))
    _judge(boundary)
    assert boundary.as_expected.get("applied"), "no valid input was applied: the oracle is off"


def _entity(raw: bytes) -> str:
    """The entity id of a well-formed input."""
    return str(json.loads(raw)["entity_id"])


def _effects(pipeline: Pipeline, wanted: set[str]) -> set[str]:
    """Every entity a projection row or a step application shows, once ``wanted`` all do.

    A step whose handler raised is tried again by the sweeper after its backoff, so the
    effects are read again until every wanted one shows or ``SETTLE_S`` passes.
    """
    deadline = time.monotonic() + SETTLE_S
    while True:
        with pipeline.db.connect() as conn:
            rows = conn.execute(
                "SELECT subscription_id FROM billing_view UNION SELECT entity_id FROM fault_effects"
            ).fetchall()
        shown = {row[0] for row in rows}
        if wanted <= shown or time.monotonic() > deadline:
            return shown
        time.sleep(1.0)


def _step_states(pipeline: Pipeline, entities: list[str]) -> list[str]:
    """What the step bookkeeping says of entities whose effect never showed (for the report)."""
    if not entities:
        return []
    with pipeline.db.connect() as conn:
        progress = conn.execute(
            "SELECT entity_id, generation, last_applied, held_at IS NOT NULL, stopped_at_seq,"
            " stop_reason FROM inorder_step_progress WHERE entity_id = ANY(%s)",
            (entities[:8],),
        ).fetchall()
        failures = conn.execute(
            "SELECT entity_id, attempt, led_to, left(error, 160) FROM inorder_step_failures"
            " WHERE entity_id = ANY(%s) ORDER BY id",
            (entities[:8],),
        ).fetchall()
    return [f"progress {row}" for row in progress] + [f"failure {row}" for row in failures]


def test_outbox_rows_at_the_edges_stop_no_relay(fuzz_pipeline: Pipeline, scale: Scale) -> None:
    """Rows written with plain SQL, each value at an edge: each refused by the table or the
    relay as the oracle expects, or sent."""
    pipeline = fuzz_pipeline
    rows = boundary_inputs.outbox_rows(scale.boundary_inputs, pipeline.events_topic, seed=37)
    written: dict[int, int] = {}  # input -> its row's id
    outcomes: dict[int, str] = {}
    statement = (
        "INSERT INTO outbox (topic, entity_type, entity_id, generation, seq, event_type,"
        " event_id, payload, headers) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb)"
        " RETURNING id"
    )

    def feed() -> None:
        with psycopg.connect(pipeline.db.url, autocommit=True) as conn:
            for i, (_, values) in enumerate(rows):
                try:
                    found = conn.execute(statement, values).fetchone()
                except (psycopg.Error, UnicodeEncodeError) as exc:
                    sent = isinstance(exc, psycopg.Error) and exc.sqlstate
                    name = type(exc).__name__ if sent else "client refused"
                    outcomes[i] = oracle_rows.table(name)
                else:
                    assert found is not None
                    written[i] = int(found[0])
                if i % CHUNK == 0:
                    assert not pipeline.crashed(), f"{pipeline.crashed()}; logs {pipeline.logs}"
                    time.sleep(0.1)  # paced as the Kafka-fed boundaries are
        pipeline.wait_for("every row sent or failed", lambda: _unsent(pipeline) == 0, timeout=300)

    boundary = _under_load(pipeline, "outbox rows (relays)", feed)
    with pipeline.db.connect() as conn:
        failed = dict(
            conn.execute(
                "SELECT id, split_part(failure_reason, ':', 1) FROM outbox"
                " WHERE id = ANY(%s::bigint[]) AND failed_at IS NOT NULL",
                (list(written.values()),),
            ).fetchall()
        )
    for i, row_id in written.items():
        outcomes[i] = oracle_rows.relay(failed[row_id]) if row_id in failed else oracle_rows.SENT
    judged = oracle_rows.OutboxTable(frozenset({pipeline.events_topic}))
    _rows_as_expected(boundary, [(what, judged.expect(values)) for what, values in rows], outcomes)
    _judge(boundary)


def _rows_as_expected(
    boundary: Boundary, expected: list[tuple[str, frozenset[str]]], outcomes: dict[int, str]
) -> None:
    """Tally each row's outcome against the outcomes the oracle allows it."""
    boundary.tried = len(expected)
    got = Counter(outcomes.values())
    boundary.refused = {k: n for k, n in got.items() if k != oracle_rows.SENT}
    boundary.taken = got[oracle_rows.SENT]
    wanted, so = Counter[str](), Counter[str]()
    for i, (what, allowed) in enumerate(expected):
        label = " | ".join(sorted(allowed))
        wanted[label] += 1
        if outcomes.get(i) in allowed:
            so[label] += 1
            continue
        boundary.unaccounted += 1
        if len(boundary.examples) < accounting.EXAMPLES:
            boundary.examples.append(f"#{i} {what[:120]}: expected {label}, {outcomes.get(i)}")
    boundary.expected, boundary.as_expected = dict(wanted), dict(so)


def _unsent(pipeline: Pipeline) -> int:
    with pipeline.db.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox o WHERE NOT outbox_published(o)"
            " AND (failed_at IS NULL OR failure_reason LIKE 'awaiting_topic:%')"
        ).fetchone()
    return int(row[0]) if row else 0


def _protocol(pipeline: Pipeline, scale: Scale, schema: str, seed: int, title: str) -> Boundary:
    """Feed schema-drawn protocol messages to their topic until its group has read them all."""
    topic, group = {
        "republish_request": ("INORDER_REPUBLISH_REQUESTS_TOPIC", "INORDER_RELAY_GROUP_ID"),
        "republish_result": ("INORDER_REPUBLISH_RESULTS_TOPIC", "INORDER_SWEEPER_GROUP_ID"),
    }[schema]
    entities = [f"sub-{i:06d}" for i in range(20)]
    inputs = boundary_inputs.protocol(schema, scale.boundary_inputs, entities, seed)

    def feed() -> None:
        _send(pipeline, pipeline.env[topic], [raw for _, raw in inputs])
        pipeline.wait_for(
            "every message handled",
            lambda: pipeline.lag(pipeline.env[topic], pipeline.env[group]) == 0,
            timeout=600,
        )

    boundary = _under_load(pipeline, title, feed)
    boundary.tried = len(inputs)
    invalid = sum(not oracle.protocol_valid(schema, raw) for _, raw in inputs)
    boundary.expected = {"invalid": invalid, "valid": len(inputs) - invalid}
    return boundary


def _invalid_as_expected(boundary: Boundary, invalid: int) -> None:
    """Every input the oracle calls invalid was counted invalid, and no valid one was.

    Counters cannot name inputs, so counts are compared: at least the oracle's invalid
    ones, at most those and what a rewind read again.
    """
    wanted = boundary.expected["invalid"]
    again = max(boundary.taken + sum(boundary.refused.values()) - boundary.tried, 0)
    missing, extra = max(wanted - invalid, 0), max(invalid - wanted - again, 0)
    boundary.as_expected = {
        "invalid": wanted - missing,
        "valid": boundary.expected["valid"] - extra,
    }
    if missing or extra:
        boundary.unaccounted += missing + extra
        boundary.examples.append(f"{wanted} invalid by the schema, {invalid} counted invalid")


def test_republish_requests_at_the_edges_stop_no_relay(
    fuzz_pipeline: Pipeline, scale: Scale
) -> None:
    """Requests drawn from their schema and pushed to the edges, to two relays."""
    pipeline = fuzz_pipeline
    boundary = _protocol(pipeline, scale, "republish_request", 38, "republish requests (relays)")
    outcomes = by_label(pipeline, RELAYS, "outbox_republish_requests_total", "outcome")
    asked = by_label(pipeline, SWEEPERS, "republish_requests_sent_total", "").total()
    boundary.refused = {"invalid": outcomes["invalid"]}
    boundary.taken = outcomes["answered"] + outcomes["cooldown"] - asked
    _invalid_as_expected(boundary, outcomes["invalid"])
    _judge(boundary)


def test_republish_results_at_the_edges_stop_no_sweeper(
    fuzz_pipeline: Pipeline, scale: Scale
) -> None:
    """Results drawn from their schema and pushed to the edges, to the active sweeper of two."""
    pipeline = fuzz_pipeline
    boundary = _protocol(pipeline, scale, "republish_result", 39, "republish results (sweepers)")
    outcomes = by_label(pipeline, SWEEPERS, "republish_results_total", "outcome")
    answers = by_label(pipeline, RELAYS, "outbox_republish_requests_total", "outcome")
    # Well-formed results that answer no open request are ignored, counted as unmatched.
    boundary.refused = {"invalid": outcomes["invalid"], "unmatched": outcomes["unmatched"]}
    # Every answer a relay sent for a sweeper's own request is a result too.
    boundary.taken = outcomes["used"] - answers["answered"] - answers["cooldown"]
    _invalid_as_expected(boundary, outcomes["invalid"])
    _judge(boundary)


def test_routes_files_at_the_edges_start_or_stop_with_one_line(
    fuzz_pipeline: Pipeline, scale: Scale, tmp_path: Path
) -> None:
    """A routes file with a value at an edge: the consumer starts, or exits 2 with one line."""
    pipeline = fuzz_pipeline
    files = boundary_inputs.routes_files(scale.routes_files, seed=40)
    boundary = Boundary("routes files (consumer start-up)")
    started = time.monotonic()
    refused = Counter[str]()
    wanted, so = Counter[str](), Counter[str]()
    for i, (what, text) in enumerate(files):
        path = tmp_path / f"routes-{i}.toml"
        path.write_text(text)
        outcome = _start_with(pipeline, path)
        if outcome == "started":
            boundary.taken += 1
        elif outcome.startswith("refused"):
            refused[outcome] += 1
        else:
            boundary.exits += 1
        allowed = oracle.routes_file(text)
        label = " or ".join(sorted(allowed))
        wanted[label] += 1
        if outcome.split(":")[0] in allowed:
            so[label] += 1
        else:
            boundary.unaccounted += 1
            boundary.examples.append(f"#{i} {what}: expected {label}, {outcome[:200]}")
    boundary.tried, boundary.refused = len(files), dict(refused)
    boundary.expected, boundary.as_expected = dict(wanted), dict(so)
    boundary.seconds = round(time.monotonic() - started, 1)
    BOUNDARIES.append(boundary)
    _judge(boundary)


def _start_with(pipeline: Pipeline, routes: Path) -> str:
    """``started``, ``refused: <first words>`` (exit 2, one line), or how it went wrong."""
    env = {**pipeline.env, "INORDER_ROUTES_FILE": str(routes), "INORDER_HTTP_PORT": "0"}
    process = subprocess.Popen(
        [tool("inorder-consumer")],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = process.communicate(timeout=8)
    except subprocess.TimeoutExpired:  # still running: it started
        process.terminate()
        _, err = process.communicate(timeout=60)
        return "started" if process.returncode == 0 else f"exit {process.returncode}: {err[-300:]}"
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("{")]
    if process.returncode == 2 and len(lines) == 1:
        return "refused: routes file" if "route" in lines[0].lower() else "refused: settings"
    return f"exit {process.returncode}: {err[-300:]}"
