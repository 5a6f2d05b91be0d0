"""inorder-consumer through real Kafka and PostgreSQL: projections, dead letters, crashes."""

from __future__ import annotations

import dataclasses
import random
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY

from consumer.settings import ConsumerSettings
from schemas import codec, encode, headers
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration.relay_support import free_port
from tests.support.kafka import drain, wait_until
from tests.support.services import Services


def _stale(event_type: str) -> float:
    return REGISTRY.get_sample_value("events_stale_total", {"event_type": event_type}) or 0.0


def test_seed_example_through_kafka(
    view: PgSchema, services: Services, topic_factory: TopicFactory, routes: Path
) -> None:
    """Stored v6; arrivals 8, 7, 9 one at a time end at 9's state with one stale event counted."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq", partitions=1)
    settings = cs.settings_for(view, services.kafka_bootstrap, routes, topic, dlq)
    before = _stale("subscription.plan_changed")
    seen = []
    with cs.running(settings):
        for seq, shown in ((6, 6), (8, 8), (7, 8), (9, 9)):
            stale_before = _stale("subscription.plan_changed")
            cs.send_events(services.kafka_bootstrap, topic, [cs.plan_event("s1", seq)])
            if seq == 7:
                wait_until(lambda b=stale_before: _stale("subscription.plan_changed") > b)
            wait_until(lambda s=shown: cs.view(view).get("s1", (0, 0))[1] == s)
            seen.append(cs.view(view)["s1"][1])
    assert seen == [6, 8, 8, 9]
    assert cs.view(view)["s1"] == (1, 9, cs.plan_event("s1", 9).payload["plan"], 900, "active")
    assert _stale("subscription.plan_changed") - before == 1


def _bad_inputs() -> list[tuple[bytes | None, str]]:
    valid = orjson.loads(encode(cs.plan_event("x", 1)))

    def doc(**changes: object) -> bytes:
        return orjson.dumps({**valid, **changes})

    missing = {k: v for k, v in valid.items() if k != "seq"}
    return [
        (None, codec.EMPTY),
        (b"", codec.EMPTY),
        (b"x" * (2 * 1024 * 1024), codec.TOO_LARGE),
        (b'{"a": "\xff"}', codec.INVALID_UTF8),
        (b"[" * 2000 + b"]" * 2000, codec.TOO_DEEP),
        (b"{nope", codec.NOT_JSON),
        (b"[]", codec.NOT_OBJECT),
        (orjson.dumps(missing), codec.MISSING_FIELD),
        (doc(seq="7"), codec.WRONG_TYPE),
        (doc(seq=True), codec.WRONG_TYPE),
        (doc(seq=-1), codec.OUT_OF_RANGE),
        (doc(seq=0), codec.OUT_OF_RANGE),
        (doc(entity_id=""), codec.BAD_LENGTH),
        (doc(entity_type="Sub:scription"), codec.BAD_FORMAT),
        (doc(entity_type="invoice", event_type="invoice.sent"), "unknown_stream"),
        (doc(entity_id="x-bad", payload={"price_cents": "lots"}), "projection_rejected"),
    ]


def test_bad_input_is_dead_lettered_and_later_events_still_apply(
    view: PgSchema, services: Services, topic_factory: TopicFactory, routes: Path
) -> None:
    """Every kind of bad input goes to the dead-letter topic with its reason; the rest applies."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq", partitions=1)
    bad = _bad_inputs()
    values: list[tuple[bytes | None, bytes | None]] = []
    for index, (value, _) in enumerate(bad):
        values.append((b"k", value))
        values.append((b"subscription:ok", encode(cs.plan_event("ok", index + 1))))
    cs.send(services.kafka_bootstrap, topic, values)
    settings = cs.settings_for(view, services.kafka_bootstrap, routes, topic, dlq)
    with cs.running(settings):
        wait_until(lambda: cs.view(view).get("ok", (0, 0))[1] == len(bad), timeout_s=60)
        letters = drain(services.kafka_bootstrap, dlq, expect=len(bad))
    found = []
    for message in letters:
        meta = {k: v.decode() for k, v in message.headers() if k.startswith("inorder-dlq")}
        found.append(meta[headers.DLQ_REASON])
        assert meta[headers.DLQ_TOPIC] == topic
        assert meta[headers.DLQ_PARTITION] == "0"
        assert int(meta[headers.DLQ_OFFSET]) % 2 == 0  # the bad ones sit at even offsets
    assert sorted(found) == sorted(reason for _, reason in bad)
    big = next(m for m in letters if dict(m.headers())[headers.DLQ_REASON] == b"too_large")
    assert dict(big.headers())[headers.DLQ_TRUNCATED_FROM] == str(2 * 1024 * 1024).encode()
    assert "x-bad" not in cs.view(view)


def test_kill_9_mid_batch_then_restart_ends_correct(
    view: PgSchema, services: Services, topic_factory: TopicFactory, routes: Path, tmp_path: Path
) -> None:
    """A consumer killed with SIGKILL mid-run and restarted still ends at every entity's newest."""
    topic, dlq = topic_factory("events", partitions=3), topic_factory("dlq")
    events = [cs.plan_event(f"s{e}", seq) for e in range(300) for seq in range(1, 101)]
    events += random.Random(1).sample(events, 3000)  # redeliveries
    random.Random(2).shuffle(events)
    cs.send_events(services.kafka_bootstrap, topic, events)
    # A short session lets the restarted consumer take the dead one's partitions quickly.
    fast = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}
    settings = cs.settings_for(
        view, services.kafka_bootstrap, routes, topic, dlq, poll_max_messages=200, kafka_extra=fast
    )
    env = cs.consumer_env(settings)
    first = cs.spawn(env, tmp_path / "consumer.log")
    wait_until(lambda: len(cs.view(view)) > 0, timeout_s=60, interval_s=0.02)
    first.kill()
    first.wait(timeout=30)
    assert any(row[1] < 100 for row in cs.view(view).values()) or len(cs.view(view)) < 300

    second = cs.spawn(env, tmp_path / "consumer.log")
    try:
        wait_until(
            lambda: (
                {k: v[1] for k, v in cs.view(view).items()} == {f"s{e}": 100 for e in range(300)}
            ),
            timeout_s=120,
        )
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    expected = {
        f"s{e}": (1, 100, cs.plan_event("s", 100).payload["plan"], 10000, "active")
        for e in range(300)
    }
    assert cs.view(view) == expected
    assert '"consumer_stopped"' in (tmp_path / "consumer.log").read_text()


def test_lost_database_connection_pauses_and_retries_the_batch(
    view: PgSchema, services: Services, topic_factory: TopicFactory, routes: Path
) -> None:
    """When the database connection dies the batch is retried after reconnecting; none is lost."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    settings = cs.settings_for(view, services.kafka_bootstrap, routes, topic, dlq)
    with cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, [cs.plan_event("s1", 1)])
        wait_until(lambda: "s1" in cs.view(view))
        with view.connect(autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND datname = current_database() "
                "AND query LIKE '%%billing_view%%'"
            )
        cs.send_events(
            services.kafka_bootstrap, topic, [cs.plan_event(f"s{i}", 2) for i in range(1, 40)]
        )
        wait_until(lambda: len(cs.view(view)) == 39 and cs.view(view)["s1"][1] == 2, timeout_s=60)


def test_readiness_follows_assignment_and_sigterm_exits_zero(
    view: PgSchema, services: Services, topic_factory: TopicFactory, routes: Path, tmp_path: Path
) -> None:
    """/readyz answers 200 once partitions are assigned; SIGTERM ends the process with 0."""
    topic, dlq = topic_factory("events"), topic_factory("dlq")
    port = free_port()
    settings = cs.settings_for(view, services.kafka_bootstrap, routes, topic, dlq, http_port=port)
    process = cs.spawn(cs.consumer_env(settings), tmp_path / "consumer.log")
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until(ready, timeout_s=60)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert b"events_consumed_total" in response.read()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


def test_routes_that_do_not_fit_the_database_stop_start_up(
    pg_schema: PgSchema, services: Services, routes: Path
) -> None:
    """Without the projection table the consumer exits 2 with a line naming the route and table."""
    env = cs.consumer_env(cs.settings_for(pg_schema, services.kafka_bootstrap, routes, "t", "d"))
    done = subprocess.run(
        [sys.executable, "-m", "consumer"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "inorder-consumer: route subscription: table billing_view does not exist; create it first"
    ]


def test_routes_file_mistakes_stop_start_up_one_line_each(
    tmp_path: Path, services: Services
) -> None:
    """A routes file with two mistakes gives two lines, each naming its route, and exit 2."""
    bad = tmp_path / "routes.toml"
    bad.write_text(
        cs.ROUTES.replace('"projection"', '"mirror"') + cs.ROUTES.replace("key =", "kee =")
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "DATABASE_URL": "postgresql://x@127.0.0.1:1/x",
        "KAFKA_BOOTSTRAP_SERVERS": services.kafka_bootstrap,
        "INORDER_ROUTES_FILE": str(bad),
    }
    done = subprocess.run(
        [sys.executable, "-m", "consumer"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 3
    assert "route 1 (subscription): unknown kind 'mirror'" in lines[0]
    assert all(line.startswith("inorder-consumer: ") for line in lines)


def _projection(
    db: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> tuple[ConsumerSettings, str, str]:
    """The billing projection's table and routes, and a consumer's settings on new topics."""
    cs.create_view(db)
    routes = tmp_path / "routes.toml"
    routes.write_text(cs.ROUTES)
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    return cs.settings_for(db, services.kafka_bootstrap, routes, topic, dlq), topic, dlq


def test_events_of_tiny_json_values_stay_within_the_shipped_memory_limit(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """60 events of 0.9 MB, each 300,000 empty objects, then a valid one: applied, VmHWM < 1 GiB."""
    settings, topic, _dlq = _projection(pg_schema, services, topic_factory, tmp_path)
    heavy = []
    for seq in range(1, 61):
        event = cs.plan_event("heavy", seq)
        payload = {**event.payload, "pad": [{}] * 300_000}
        heavy.append((event.key, encode(dataclasses.replace(event, payload=payload))))
    cs.send(services.kafka_bootstrap, topic, heavy)
    cs.send(services.kafka_bootstrap, topic, [(b"k", encode(cs.plan_event("light", 1)))])
    process = cs.spawn(cs.consumer_env(settings), tmp_path / "consumer.log")
    try:
        wait_until(lambda: "light" in cs.view(pg_schema), timeout_s=180)
        status = Path(f"/proc/{process.pid}/status").read_text()
    finally:
        process.terminate()
        process.wait(30)
    peak_kib = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM")
    )
    assert cs.view(pg_schema)["heavy"][1] == 60
    print(f"consumer peak RSS {peak_kib // 1024} MiB")
    assert peak_kib < 1024 * 1024, f"peak RSS {peak_kib // 1024} MiB"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("ALTER TABLE billing_view ALTER COLUMN plan TYPE integer USING 0", "column 'plan'"),
        ("ALTER TABLE billing_view DROP CONSTRAINT billing_view_pkey", "unique index"),
        ("ALTER TABLE billing_view DROP COLUMN status", "no column 'status'"),
    ],
)
def test_a_table_changed_under_the_consumer_stops_it_instead_of_dead_lettering_the_stream(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    change: str,
    named: str,
) -> None:
    """An operator changes the projection's table while events flow: exit 3, one line, no letter."""
    settings, topic, dlq = _projection(pg_schema, services, topic_factory, tmp_path)
    log = tmp_path / "consumer.log"
    process = cs.spawn(cs.consumer_env(settings), log)
    try:
        cs.send_events(services.kafka_bootstrap, topic, [cs.plan_event("before", 1)])
        wait_until(lambda: "before" in cs.view(pg_schema))
        with pg_schema.connect(autocommit=True) as conn:
            conn.execute(change)
        cs.send_events(
            services.kafka_bootstrap, topic, [cs.plan_event(f"e{i}", 1) for i in range(5)]
        )
        assert process.wait(60) == 3  # a hang guard
    finally:
        if process.poll() is None:
            process.kill()
    lines = log.read_text().splitlines()
    stopped = [line for line in lines if "stopped:" in line]
    assert len(stopped) == 1, lines[-5:]
    assert named in stopped[0]
    assert "Traceback" not in log.read_text()
    assert drain(services.kafka_bootstrap, dlq, max_s=3) == []
