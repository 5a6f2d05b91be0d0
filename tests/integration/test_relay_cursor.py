"""The transaction-id cursor against real PostgreSQL and Kafka: open, late, rolled-back writers."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import schemas
from producer import OutboxEvent, emit
from tests.conftest import PgSchema, TopicFactory
from tests.integration import relay_support as rs
from tests.support.kafka import drain, wait_until
from tests.support.services import Services


@pytest.fixture
def topics(topic_factory: TopicFactory) -> rs.RelayTopics:
    return rs.RelayTopics(
        topic_factory("events"), topic_factory("requests"), topic_factory("results")
    )


@pytest.fixture
def outbox(pg_schema: PgSchema) -> PgSchema:
    rs.prepare_outbox(pg_schema)
    return pg_schema


def _event(topic: str, entity: str, seq: int = 1) -> OutboxEvent:
    return OutboxEvent(
        "subscription", entity, seq, "subscription.plan_changed", rs.PAYLOAD, topic=topic
    )


def _sent_ids(services: Services, topic: str, expect: int) -> Counter[str]:
    return Counter(
        schemas.decode(m.value()).event_id
        for m in drain(services.kafka_bootstrap, topic, expect=expect)
    )


def _gauge(name: str) -> float:
    return sum(s.value for m in REGISTRY.collect() for s in m.samples if s.name == name)


def test_a_long_transaction_delays_only_its_own_rows(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """Rows committed after a long open transaction go out at once; its own follow its commit."""
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    with rs.running(settings), outbox.connect() as long:
        with long.transaction():
            emit(long, _event(topics.events, "long"))
            rs.write_rows(outbox, topics.events, 20, entities=20)
            wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 20)
            assert rs.unsent(outbox) == 0  # the open transaction's row is not visible yet
            wait_until(lambda: _gauge("outbox_running_transactions") >= 1, timeout_s=15)
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 21)
    assert _sent_ids(services, topics.events, 21)["subscription:long:1:1"] == 1


def test_an_early_id_committed_late_and_a_rollback(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """A transaction that took its id before others wrote is still sent; a rolled-back one never."""
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    with rs.running(settings), outbox.connect() as early, outbox.connect() as doomed:
        with early.transaction():
            early.execute("SELECT pg_current_xact_id()")  # the id is taken now
            doomed.execute("SELECT 1")  # opens the transaction emit joins
            emit(doomed, _event(topics.events, "doomed"))
            rs.write_rows(outbox, topics.events, 10, entities=10)
            wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 10)
            doomed.rollback()
            emit(early, _event(topics.events, "early"))
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 11)
    sent = _sent_ids(services, topics.events, 11)
    assert sent["subscription:early:1:1"] == 1
    assert "subscription:doomed:1:1" not in sent
    assert sum(sent.values()) == 11


def test_two_relays_share_the_slices_and_a_survivor_takes_them_all(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """Two relays hold 8 slices each; when one is killed the other takes all 16 after the lease."""
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, lease_s=2)
    env = rs.relay_env(settings)
    first = rs.spawn(env, tmp_path / "relay.log")
    second = rs.spawn(env, tmp_path / "relay.log")
    try:
        wait_until(lambda: _owners(outbox) == {first.pid: 8, second.pid: 8}, timeout_s=30)
        first.kill()
        first.wait(timeout=30)
        wait_until(lambda: _owners(outbox) == {second.pid: 16}, timeout_s=30)
        ids = rs.write_rows(outbox, topics.events, 200, entities=50)
        wait_until(lambda: rs.unsent(outbox) == 0)
    finally:
        second.terminate()
        second.wait(timeout=60)
    assert _sent_ids(services, topics.events, 200) == Counter(ids)
    assert _owners(outbox) == {}  # a clean stop gives the slices back at once


def _owners(schema: PgSchema) -> dict[int, int]:
    """Slices held per relay process id (from the owner's ``host:pid:tag``)."""
    with schema.connect() as conn:
        rows = conn.execute(
            "SELECT split_part(owner, ':', 2)::int, count(*) FROM outbox_relay_slices"
            " WHERE owner IS NOT NULL AND lease_until > now() GROUP BY 1"
        ).fetchall()
    return dict(rows)


def test_transaction_ids_ahead_of_the_cluster_stop_start_up(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """An outbox restored from another cluster (ids ahead of its own) stops the relay: one line."""
    rs.write_rows(outbox, topics.events, 1)
    with outbox.connect() as conn:
        conn.execute("UPDATE outbox SET xid = '999999999999'")
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    done = subprocess.run(
        [sys.executable, "-m", "outbox_relay"],
        env=rs.relay_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.startswith("inorder-relay:")]
    assert line.startswith("inorder-relay: the outbox holds transaction id 999999999999")
    assert rs.count_rows(outbox, rs.SENT) == 0
