"""Lanes past the poll batch, on real Kafka, PostgreSQL and Redis: a slow entity holds one lane."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from consumer.kinds.steps.parking import ParkingLot
from schemas import Event, headers
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import step_handlers
from tests.integration import step_support as ss
from tests.support.kafka import drain, wait_until
from tests.support.services import Services

GATED_ROUTE = (
    '[route.handlers."ledger.mailed"]\n'
    'function = "tests.integration.step_handlers:gated_call"\n'
    "external = true\nidempotent = true\n"
)


def _routes(folder: Path, *, max_parked: int = 1000) -> Path:
    path = folder / "routes.toml"
    text = ss.routes_text(max_parked=max_parked, extra=GATED_ROUTE)
    path.write_text(text.replace('kind = "step"\n', 'kind = "step"\nlanes = 4\n'))
    return path


@pytest.fixture
def routes(tmp_path: Path) -> Path:
    return _routes(tmp_path)


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


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"route": ss.STREAM}) or 0.0


def _lane_events() -> float:
    return _sample("steps_lane_events")


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
        wait_until(lambda: cs.committed(settings, topic) == 3)
        assert ss.applied(steps_db, "slow") == []
        # slow:2 waits in the entity's lane, not in Redis, and the gauge shows both.
        key = ParkingLot(redis_client, settings.redis_key_prefix).entity_key(ss.STREAM, "slow")
        assert redis_client.zcard(key) == 0
        assert _lane_events() == 2.0
        wait_until(lambda: _sample("steps_lane_oldest_age_seconds") >= 1.0)
        assert cs.committed(settings, topic) == 3
        gate.set()
        wait_until(lambda: ss.applied(steps_db, "slow") == [(1, 1), (1, 2)])
        wait_until(lambda: cs.committed(settings, topic) == 4 + len(later))
        wait_until(lambda: _lane_events() == 0.0)
        assert _sample("steps_lane_oldest_age_seconds") == 0.0
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
        wait_until(lambda: cs.committed(settings, topic) == len(events))
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
    assert cs.committed(settings, topic) == len(events)


def test_parks_drains_stops_and_holds_happen_in_the_lane(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
    gate: threading.Event,
) -> None:
    """In lanes: early steps park and drain, a raising call stops its entity, a full set holds."""
    topic, dlq, held = (topic_factory(n, partitions=1) for n in ("events", "dlq", "held"))
    routes = _routes(tmp_path, max_parked=2)
    settings = cs.parking_settings_for(
        steps_db, services, routes, topic, dlq, redis_prefix, held_topic=held
    )
    lot = ParkingLot(redis_client, settings.redis_key_prefix)
    with cs.running(settings):
        # p: 2 and 3 park before 1 comes; its lane applies 1 and drains 2 and 3.
        cs.send_events(services.kafka_bootstrap, topic, [_mailed(3, "p"), _mailed(2, "p")])
        wait_until(lambda: redis_client.zcard(lot.entity_key(ss.STREAM, "p")) == 2)
        # slow: 3, 4 and 5 queue behind the hanging 1 in its lane; then 3 and 4 park and the
        # parking cap (2) holds the entity at 5. boom: its call raises, so it stops at 1.
        first = [_mailed(1, "p"), _mailed(1, "slow"), _mailed(1, "boom-1"), _mailed(2, "boom-1")]
        cs.send_events(services.kafka_bootstrap, topic, first)
        wait_until(lambda: step_handlers.GATED == [("slow", 1)])
        queued = [_mailed(s, "slow") for s in (3, 4, 5)]
        cs.send_events(services.kafka_bootstrap, topic, queued)
        wait_until(lambda: ss.applied(steps_db, "p") == [(1, 1), (1, 2), (1, 3)])
        wait_until(lambda: _lane_events() == 4.0)  # slow: 1, 3, 4, 5
        gate.set()
        wait_until(lambda: (ss.progress(steps_db, "slow") or (0, 0, False))[2])
        wait_until(lambda: cs.committed(settings, topic) == 9)
    assert not redis_client.exists(lot.entity_key(ss.STREAM, "p"))
    assert ss.applied(steps_db, "slow") == [(1, 1)]
    assert lot.parked_seqs(ss.STREAM, "slow") == [3, 4]
    [letter] = drain(services.kafka_bootstrap, held, expect=1)
    said = dict(letter.headers() or [])
    assert (said[headers.DLQ_REASON], said[headers.DLQ_OFFSET]) == (b"park_cap_reached", b"8")
    _, last, _, stopped_at, reason = ss.progress(steps_db, "boom-1")
    assert (last, stopped_at) == (0, 1)
    assert "the mail API answered 503" in reason
    assert lot.parked_seqs(ss.STREAM, "boom-1") == [1, 2]  # waiting for a person


def test_a_row_locked_elsewhere_holds_its_own_entity_only(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    routes: Path,
    redis_prefix: str,
) -> None:
    """Another session locks one entity's progress: the other entities of its batch apply."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    settings = cs.parking_settings_for(steps_db, services, routes, topic, dlq, redis_prefix)
    others = [f"n{i}" for i in range(3)]
    with cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, [_mailed(1, "locked")])
        wait_until(lambda: ss.applied(steps_db, "locked") == [(1, 1)])
        with steps_db.connect() as other, other.transaction():
            other.execute(
                "SELECT 1 FROM inorder_step_progress WHERE entity_id = 'locked' FOR UPDATE"
            )
            batch = [_mailed(2, "locked")] + [_mailed(1, e) for e in others]
            cs.send_events(services.kafka_bootstrap, topic, batch)
            wait_until(lambda: all(ss.applied(steps_db, e) == [(1, 1)] for e in others))
            assert ss.applied(steps_db, "locked") == [(1, 1)]
        wait_until(lambda: ss.applied(steps_db, "locked") == [(1, 1), (1, 2)])
        wait_until(lambda: cs.committed(settings, topic) == 5)
