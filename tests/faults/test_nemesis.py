"""Faults that are not clean kills: frozen processes that wake as zombies, cut links, a clock
days ahead, a full disk. Each test runs the fault suite's load through one of them, judges
the settled pipeline as the fault suite does, and checks the property the fault threatens.

Those marked ``nemesis`` run in ``make test-nemesis`` and ``make test-faults``; ``make test``
runs the two quick ones and the schedule, which strikes once with each kind.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer

from tests.conftest import PgSchema, TopicFactory
from tests.faults import clock, firewall
from tests.faults.conftest import NOTES, Scale
from tests.faults.disk import SmallDiskPostgres, SmallDiskRedis
from tests.faults.pipeline import Pipeline
from tests.faults.proxy import FaultProxy, kafka_faulty
from tests.faults.test_faults import STANDARD, run, start
from tests.faults.watch import Watch
from tests.support.services import Services

pytestmark = [pytest.mark.faults, pytest.mark.services, pytest.mark.timeout(900)]

SESSION_S = 6  # the pipeline's Kafka session timeout


def _cursors(pipeline: Pipeline) -> dict[Any, Any]:
    with pipeline.db.connect() as conn:
        rows = conn.execute(
            "SELECT slice, cursor_xid::text::numeric, cursor_id FROM outbox_relay_slices"
        ).fetchall()
    return {s: (x, i) for s, x, i in rows}


def _requests_by_attempt(pipeline: Pipeline) -> Counter[str]:
    """Every republish request on the topic, counted by gap and attempt."""
    topic = pipeline.env["INORDER_REPUBLISH_REQUESTS_TOPIC"]
    reader = Consumer(
        {
            "bootstrap.servers": pipeline.services.kafka_bootstrap,
            "group.id": f"{pipeline.group}-audit",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    seen: Counter[str] = Counter()
    try:
        reader.subscribe([topic])
        idle = time.monotonic()
        while time.monotonic() - idle < 5:
            message = reader.poll(0.5)
            if message is None or message.error() is not None:
                continue
            idle = time.monotonic()
            request_id = json.loads(message.value())["request_id"]
            seen["-".join(request_id.split("-")[:3])] += 1  # gap-<id>-<attempt>
    finally:
        reader.close()
    return seen


def _run_watching(
    pipeline: Pipeline,
    scale: Scale,
    fault: str,
    inject: Callable[[], int],
    read: Callable[[], Mapping[Hashable, Any]] | None = None,
) -> Watch:
    """``run`` while sampling ``read`` (the committed offsets by default) throughout."""
    with Watch(read or pipeline.committed, every=0.4) as watch:
        run(pipeline, scale, fault, inject)
    assert watch.samples > 10
    return watch


def _freeze_twice(pipeline: Pipeline, name: str, seconds: float) -> int:
    """SIGSTOP ``name`` for ``seconds``, twice, a second apart; the faults injected."""
    for _ in range(2):
        time.sleep(1.0)
        pipeline.pause(name)
        time.sleep(seconds)
        pipeline.resume(name)
    return 2


@pytest.mark.nemesis
def test_a_consumer_frozen_past_its_session_wakes_as_a_zombie_and_changes_nothing(
    pipeline: Pipeline, scale: Scale
) -> None:
    """Frozen past its session, then woken: it doubles no step and moves no offset back."""
    start(pipeline, *STANDARD)

    def inject() -> int:  # consumer-2 has its partitions 4 s before each wake
        return _freeze_twice(pipeline, "consumer-1", SESSION_S + 4)

    offsets = _run_watching(pipeline, scale, "consumer paused past its session", inject)
    assert offsets.went_back == [], "a zombie consumer moved a committed offset back"


@pytest.mark.nemesis
def test_a_relay_frozen_past_its_lease_wakes_as_a_zombie_and_moves_no_cursor(
    pipeline: Pipeline, scale: Scale
) -> None:
    """Frozen past its lease while relay-2 takes over, then woken: no cursor back, no row lost."""
    lease = {"INORDER_LEASE_S": "3"}
    pipeline.start("relay-1", env=lease)
    pipeline.start("relay-2", env=lease)
    start(pipeline, "consumer-1", "consumer-2", "sweeper-1")

    def inject() -> int:
        return _freeze_twice(pipeline, "relay-1", 3 + 4)

    cursors = _run_watching(
        pipeline, scale, "relay paused past its lease", inject, lambda: _cursors(pipeline)
    )
    assert cursors.went_back == [], "a zombie relay moved a slice's cursor back"


@pytest.mark.nemesis
def test_a_sweeper_frozen_past_its_lease_acts_on_nothing_once_another_holds_it(
    pipeline: Pipeline, scale: Scale
) -> None:
    """The active sweeper frozen mid-work with gaps open, three times: one request per attempt."""
    start(pipeline, *STANDARD, "sweeper-2")

    def active() -> str | None:
        found = [n for n in ("sweeper-1", "sweeper-2") if pipeline.metric(n, "sweeper_active")]
        return found[0] if found else None

    def inject() -> int:
        frozen = 0
        for i in range(3):
            pipeline.lose_one_event(f"lost-zombie-{i}")
            pipeline.wait_for("a gap escalated", lambda: pipeline.gaps() > 0)
            pipeline.wait_for("a sweeper active", lambda: active() is not None)
            holder = active()
            assert holder is not None
            pipeline.pause(holder)
            time.sleep(3 + 3)  # the lease (3 s) lapses and the standby takes it
            pipeline.resume(holder)
            frozen += 1
        return frozen

    run(pipeline, scale, "active sweeper paused past its lease", inject)
    requests = _requests_by_attempt(pipeline)
    assert requests, "no republish request was made"
    assert [key for key, n in requests.items() if n > 1] == []


@pytest.mark.nemesis
@pytest.mark.skipif(not firewall.available(), reason="iptables cannot add rules here")
def test_a_cut_link_to_postgresql_is_noticed_within_30_s_and_healed_after(
    pipeline: Pipeline, scale: Scale
) -> None:
    """Every packet between consumer-1 and PostgreSQL lost: unready within 30 s, whole after."""
    proxy = FaultProxy(pipeline.db.url)
    try:
        start(pipeline, "relay-1", "consumer-2", "sweeper-1")
        pipeline.start("consumer-1", env={"DATABASE_URL": proxy.address(pipeline.db.url)})
        pipeline.wait_for("consumer-1 ready", lambda: pipeline.ready("consumer-1"))
        noticed: list[float] = []

        def inject() -> int:
            with firewall.dropping(proxy.port):
                cut = time.monotonic()
                pipeline.wait_for(
                    "consumer-1 reports PostgreSQL down",
                    lambda: not pipeline.ready("consumer-1"),
                    timeout=90,
                )
                noticed.append(time.monotonic() - cut)
                time.sleep(scale.outage_s)
            pipeline.wait_for("consumer-1 ready again", lambda: pipeline.ready("consumer-1"), 120)
            return 1

        run(pipeline, scale, "link to postgres cut (consumer)", inject)
    finally:
        proxy.close()
    NOTES.append(f"link to postgres cut (consumer): noticed after {noticed[0]:.1f} s")
    assert noticed[0] <= 30, f"the cut was noticed after {noticed[0]:.1f}s"


@pytest.mark.nemesis
@pytest.mark.skipif(
    not firewall.available() or kafka_faulty() is None,
    reason="iptables cannot add rules here, or the broker has no FAULTY listener",
)
def test_a_consumer_cut_from_kafka_past_its_session_loses_its_partitions_and_rejoins(
    pipeline: Pipeline, scale: Scale
) -> None:
    """consumer-1's Kafka link drops every packet for 15 s: consumer-2 takes over, it rejoins."""
    faulty = kafka_faulty()
    assert faulty is not None
    listener, port = faulty

    def _assignments(name: str) -> int:
        """How many times the process was given partitions, from its log."""
        lines = (pipeline.logs / f"{name}.log").read_text(errors="replace").splitlines()
        return sum(
            1
            for line in lines
            if '"event": "partitions_assigned"' in line and '"partitions": []' not in line
        )

    proxy = FaultProxy(listener, port=port)
    try:
        start(pipeline, "relay-1", "consumer-2", "sweeper-1")
        pipeline.start("consumer-1", env={"KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"})
        pipeline.wait_for("consumer-1 given partitions", lambda: _assignments("consumer-1") > 0)

        def inject() -> int:
            pipeline.lose_one_event("lost-kafka-link")
            given = _assignments("consumer-1")
            with firewall.dropping(proxy.port):
                time.sleep(SESSION_S + 9)
            pipeline.wait_for(
                "consumer-1 rejoined and given partitions again",
                lambda: _assignments("consumer-1") > given,
                120,
            )
            return 1

        offsets = _run_watching(pipeline, scale, "link to kafka cut (consumer)", inject)
    finally:
        proxy.close()
    assert offsets.went_back == [], "a consumer cut from Kafka moved a committed offset back"


@pytest.mark.nemesis
def test_a_blackholed_link_to_redis_pauses_the_consumer_and_heals(
    pipeline: Pipeline, scale: Scale
) -> None:
    """Redis accepts consumer-1's bytes and never answers: it goes unready, then resumes."""
    redis_url = pipeline.env["REDIS_URL"]
    proxy = FaultProxy(redis_url)
    try:
        start(pipeline, "relay-1", "consumer-2", "sweeper-1")
        pipeline.start("consumer-1", env={"REDIS_URL": proxy.address(redis_url)})
        pipeline.wait_for("consumer-1 ready", lambda: pipeline.ready("consumer-1"))

        def inject() -> int:
            pipeline.lose_one_event("lost-blackhole")  # parking: Redis is written for sure
            proxy.blackhole()
            try:
                pipeline.wait_for(
                    "consumer-1 reports Redis down", lambda: not pipeline.ready("consumer-1"), 90
                )
                time.sleep(scale.outage_s)
            finally:
                proxy.heal()
            pipeline.wait_for("consumer-1 ready again", lambda: pipeline.ready("consumer-1"), 120)
            return 1

        run(pipeline, scale, "link to redis blackholed (consumer)", inject)
    finally:
        proxy.close()


@pytest.mark.nemesis
def test_slow_and_lossy_links_lose_nothing(pipeline: Pipeline, scale: Scale) -> None:
    """Every program's links to PostgreSQL and Redis slowed, then losing packets: all whole."""
    proxies = {
        "pg": FaultProxy(pipeline.db.url, seed=1),
        "redis": FaultProxy(pipeline.env["REDIS_URL"], seed=2),
    }
    own = {
        "DATABASE_URL": proxies["pg"].address(pipeline.db.url),
        "REDIS_URL": proxies["redis"].address(pipeline.env["REDIS_URL"]),
    }
    try:
        for name in STANDARD:
            pipeline.start(name, env=own)
        pipeline.wait_for("all ready", lambda: all(pipeline.ready(n) for n in STANDARD))

        def inject() -> int:
            for proxy in proxies.values():
                proxy.slow(0.02, 0.03)
            time.sleep(scale.outage_s)
            for proxy in proxies.values():
                proxy.heal()
            if firewall.available():
                with (
                    firewall.dropping(proxies["pg"].port, 0.1),
                    firewall.dropping(proxies["redis"].port, 0.1),
                ):
                    time.sleep(scale.outage_s)
            return 2

        run(pipeline, scale, "slow and lossy links", inject)
    finally:
        for proxy in proxies.values():
            proxy.close()


def test_a_consumer_whose_clock_jumps_30_days_ahead_still_has_its_gap_repaired(
    pipeline: Pipeline, scale: Scale, tmp_path: Path
) -> None:
    """consumer-1's clock jumps 30 days ahead mid-run: a lost event is still repaired."""
    offset = tmp_path / "faketime"
    pipeline.start("consumer-1", env=clock.clock_env(offset, pipeline.env["PYTHONPATH"]))
    start(pipeline, "relay-1", "sweeper-1")
    pipeline.wait_for("consumer-1 ready", lambda: pipeline.ready("consumer-1"))

    def inject() -> int:
        clock.jump(offset, "+30d")
        time.sleep(2)  # the new offset is read within a second
        pipeline.lose_one_event("lost-clock")
        return 1

    run(pipeline, scale, "consumer clock +30 days", inject)
    assert pipeline.count("SELECT count(*) FROM inorder_gaps WHERE status = 'healed'") >= 1


def _disk_filled(
    pipeline: Pipeline,
    disk: SmallDiskRedis | SmallDiskPostgres,
    scale: Scale,
    fault: str,
    watched: tuple[str, ...],
) -> None:
    """Fill ``disk`` under the load until one of ``watched`` goes unready, free it, judge."""
    try:
        start(pipeline, *STANDARD)

        def inject() -> int:
            if isinstance(disk, SmallDiskRedis):
                pipeline.lose_one_event("lost-disk")  # parks for sure: Redis must be written
            disk.fill()
            try:
                pipeline.wait_for(
                    f"{fault}: a program reports its dependency down",
                    lambda: not all(pipeline.ready(n) for n in watched),
                    90,
                )
                time.sleep(scale.outage_s)
            finally:
                disk.free()
            pipeline.wait_for("all ready again", lambda: all(pipeline.ready(n) for n in STANDARD))
            return 1

        run(pipeline, scale, fault, inject)
    finally:
        pipeline.close()
        disk.close()


def test_a_full_disk_under_redis_pauses_the_consumers_and_loses_nothing(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    scale: Scale,
) -> None:
    """Redis's AOF disk full (MISCONF): consumers go unready, none crashes; all whole after."""
    small = SmallDiskRedis(tmp_path)
    pipeline = Pipeline(pg_schema, services, topic_factory, tmp_path, REDIS_URL=small.url)
    _disk_filled(pipeline, small, scale, "redis disk full", ("consumer-1", "consumer-2"))


@pytest.mark.nemesis
def test_a_full_wal_disk_under_postgresql_is_waited_out_and_loses_nothing(
    services: Services, topic_factory: TopicFactory, tmp_path: Path, scale: Scale
) -> None:
    """PostgreSQL's WAL disk full, then the server down: every program waits and resumes."""
    small = SmallDiskPostgres()
    with psycopg.connect(small.database_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA nemesis")
    pipeline = Pipeline(PgSchema(small.database_url, "nemesis"), services, topic_factory, tmp_path)
    _disk_filled(pipeline, small, scale, "postgres wal disk full", STANDARD)
