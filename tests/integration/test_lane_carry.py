"""Lanes past the poll batch, on real Kafka, PostgreSQL and Redis: a slow entity holds one lane."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY

from consumer.kinds.steps.parking import ParkingLot
from consumer.settings import ConsumerSettings
from schemas import Event
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import step_handlers
from tests.integration import step_support as ss
from tests.support.kafka import wait_until
from tests.support.services import Services

GATED_ROUTE = (
    '[route.handlers."ledger.mailed"]\n'
    'function = "tests.integration.step_handlers:gated_call"\n'
    "external = true\nidempotent = true\n"
)


@pytest.fixture
def steps_db(pg_schema: PgSchema) -> PgSchema:
    ss.prepare(pg_schema)
    return pg_schema


@pytest.fixture
def routes(tmp_path: Path) -> Path:
    path = tmp_path / "routes.toml"
    text = ss.routes_text(extra=GATED_ROUTE).replace(
        'kind = "step"\n', 'kind = "step"\nlanes = 4\n'
    )
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def gate() -> threading.Event:
    """The gate starts closed, and is opened whatever the test did, so no lane waits on."""
    step_handlers.GATE.clear()
    step_handlers.GATED.clear()
    step_handlers.LOST_ONCE.clear()
    yield step_handlers.GATE
    step_handlers.GATE.set()


def _mailed(seq: int, entity: str) -> Event:
    return ss.step(seq, entity, event_type="ledger.mailed")


def _committed(settings: ConsumerSettings, topic: str) -> int:
    """The group's committed offset of partition 0 (-1001: none)."""
    reader = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": settings.group_id}
    )
    try:
        [where] = reader.committed([TopicPartition(topic, 0)], timeout=10)
        return int(where.offset)
    finally:
        reader.close()


def _lane_events() -> float:
    return REGISTRY.get_sample_value("steps_lane_events", {"route": ss.STREAM}) or 0.0


def test_a_slow_entity_holds_its_lane_while_later_batches_apply_and_offsets_wait_for_it(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    routes: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
    gate: threading.Event,
) -> None:
    """A call hangs: 20 entities of later batches apply, no commit passes it, then all in order."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    settings = cs.parking_settings_for(steps_db, services, routes, topic, dlq, redis_prefix)
    others = [f"o{i:02}" for i in range(20)]
    with cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, [ss.step(s, "early") for s in (1, 2, 3)])
        cs.send_events(services.kafka_bootstrap, topic, [_mailed(1, "slow")])  # offset 3
        wait_until(lambda: step_handlers.GATED == [("slow", 1)])
        later = [_mailed(s, e) for s in (1, 2) for e in others] + [_mailed(2, "slow")]
        cs.send_events(services.kafka_bootstrap, topic, later)
        wait_until(lambda: all(ss.applied(steps_db, e) == [(1, 1), (1, 2)] for e in others))
        wait_until(lambda: _committed(settings, topic) == 3)
        assert ss.applied(steps_db, "slow") == []
        # slow:2 waits in the entity's lane, not in Redis, and the gauge shows both.
        key = ParkingLot(redis_client, settings.redis_key_prefix).entity_key(ss.STREAM, "slow")
        assert redis_client.zcard(key) == 0
        assert _lane_events() == 2.0
        assert _committed(settings, topic) == 3
        gate.set()
        wait_until(lambda: ss.applied(steps_db, "slow") == [(1, 1), (1, 2)])
        wait_until(lambda: _committed(settings, topic) == 4 + len(later))
        wait_until(lambda: _lane_events() == 0.0)
    assert step_handlers.GATED == [("slow", 1), ("slow", 2)]
    assert ss.applied(steps_db, "early") == [(1, 1), (1, 2), (1, 3)]


def test_a_lane_that_loses_the_database_pauses_and_applies_once_in_order(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    routes: Path,
    redis_prefix: str,
) -> None:
    """Two entities' first calls lose PostgreSQL: the loop waits it out; all apply once in order."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    settings = cs.parking_settings_for(steps_db, services, routes, topic, dlq, redis_prefix)
    entities = ["flaky-a", "flaky-b", "n1", "n2", "n3"]
    events = [_mailed(s, e) for s in (1, 2, 3) for e in entities]
    with cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, events)
        for entity in entities:
            wait_until(lambda e=entity: ss.applied(steps_db, e) == [(1, 1), (1, 2), (1, 3)])
        wait_until(lambda: _committed(settings, topic) == len(events))
    assert sorted(step_handlers.LOST_ONCE) == ["flaky-a", "flaky-b"]
    for entity in entities:
        assert ss.progress(steps_db, entity)[:2] == (1, 3)


def test_stopping_waits_for_the_lanes_and_commits_what_they_finished(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    routes: Path,
    redis_prefix: str,
    gate: threading.Event,
) -> None:
    """Stop while a call hangs: the consumer waits for it, reports it and commits past it."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    settings = cs.parking_settings_for(steps_db, services, routes, topic, dlq, redis_prefix)
    events = [_mailed(1, "slow"), _mailed(1, "n1"), _mailed(2, "slow")]
    with cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, events)
        wait_until(lambda: step_handlers.GATED == [("slow", 1)])
        wait_until(lambda: ss.applied(steps_db, "n1") == [(1, 1)])
        threading.Timer(1.0, gate.set).start()  # opens while the consumer is stopping
    assert ss.applied(steps_db, "slow") == [(1, 1), (1, 2)]
    assert _committed(settings, topic) == len(events)
