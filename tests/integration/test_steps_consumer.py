"""Step routes through real Kafka, PostgreSQL and Redis: the seed example, races, restarts."""

from __future__ import annotations

import dataclasses
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from consumer.kinds.steps.parking import ParkingLot
from schemas import decode, encode, headers
from schemas.runtime.redis_client import RedisClient, each_node
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import step_support as ss
from tests.support.kafka import drain, wait_until
from tests.support.services import Services


@pytest.fixture
def routes(tmp_path: Path) -> Path:
    path = tmp_path / "routes.toml"
    path.write_text(ss.routes_text())
    return path


def test_seed_example_through_kafka_and_redis(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    routes: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    """Applied up to 6; 8 arrives and parks; 7 arrives; 7 then 8 apply; last_applied is 8."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    settings = cs.parking_settings_for(steps_db, services, routes, topic, dlq, redis_prefix)
    with cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, [ss.step(s) for s in range(1, 7)])
        wait_until(lambda: (ss.progress(steps_db) or (0, 0))[1] == 6)
        cs.send_events(services.kafka_bootstrap, topic, [ss.step(8)])
        key = ParkingLot(redis_client, settings.redis_key_prefix).entity_key("ledger", "a")
        wait_until(lambda: redis_client.zcard(key) == 1)
        assert ss.progress(steps_db)[1] == 6
        cs.send_events(services.kafka_bootstrap, topic, [ss.step(7)])
        wait_until(lambda: ss.progress(steps_db)[1] == 8)
    assert ss.applied(steps_db) == [(1, s) for s in range(1, 9)]
    assert not redis_client.exists(key)


def test_two_consumers_racing_apply_every_step_exactly_once(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    routes: Path,
    redis_prefix: str,
) -> None:
    """Two consumer groups get the same shuffled events; each seq of each entity applies once."""
    topic, dlq = topic_factory("events", partitions=3), topic_factory("dlq")
    events = [ss.step(s, f"e{e}") for e in range(20) for s in range(1, 51)]
    random.Random(4).shuffle(events)
    first = cs.parking_settings_for(
        steps_db, services, routes, topic, dlq, redis_prefix, poll_max_messages=37
    )
    second = cs.parking_settings_for(
        steps_db, services, routes, topic, dlq, redis_prefix, poll_max_messages=53
    )
    with cs.running(first), cs.running(second):
        cs.send_events(services.kafka_bootstrap, topic, events)
        wait_until(lambda: _done(steps_db, 20, 50), timeout_s=90)
    for entity in range(20):
        assert ss.applied(steps_db, f"e{entity}") == [(1, s) for s in range(1, 51)]


def _done(db: PgSchema, entities: int, last: int) -> bool:
    with db.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM inorder_step_progress WHERE last_applied = %s", (last,)
        ).fetchone()
    return bool(row and row[0] == entities)


def test_redis_restart_while_parked_loses_nothing(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    routes: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    """Events parked before a Redis restart (AOF) are still there and drain afterwards."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    settings = cs.parking_settings_for(steps_db, services, routes, topic, dlq, redis_prefix)
    key = ParkingLot(redis_client, settings.redis_key_prefix).entity_key("ledger", "a")
    with cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, [ss.step(s) for s in (1, 3, 4, 5)])
        wait_until(lambda: redis_client.zcard(key) == 3)
        time.sleep(1.2)  # appendfsync everysec
        services.restart("redis")
        cs.send_events(services.kafka_bootstrap, topic, [ss.step(2)])
        wait_until(lambda: (ss.progress(steps_db) or (0, 0))[1] == 5, timeout_s=60)
    assert ss.applied(steps_db) == [(1, s) for s in range(1, 6)]


def _consumer(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "consumer"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


# How the refusal names the store: "Redis", or "Redis node host:port" on a cluster.
_WHO = r"Redis( node [0-9.]+:[0-9]+)?"


def _config_everywhere(client: RedisClient, name: str, value: str) -> None:
    """Set a Redis setting on every node (one Redis, or each node of a cluster)."""
    for _, node in each_node(client):
        node.config_set(name, value)


def test_non_durable_redis_stops_start_up_unless_trusted(
    steps_db: PgSchema,
    services: Services,
    routes: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    """With AOF off the consumer refuses to start, saying how to override; the override works."""
    settings = cs.parking_settings_for(
        steps_db, services, routes, "t", "d", redis_prefix, http_port=0
    )
    env = {**cs.consumer_env(settings), "REDIS_URL": services.redis_url}
    _config_everywhere(redis_client, "appendonly", "no")
    try:
        refused = _consumer(env)
        _, err = refused.communicate(timeout=60)
        assert refused.returncode == 2
        assert re.fullmatch(
            "inorder-consumer: "
            + _WHO
            + re.escape(
                " has AOF off (appendonly no), so parked events could be lost in a restart; "
                "turn on appendonly, or set INORDER_PARK_STORE_TRUSTED=true if the store is "
                "durable some other way"
            ),
            err.strip(),
        ), err
        trusted = _consumer({**env, "INORDER_PARK_STORE_TRUSTED": "true"})
        time.sleep(3)
        assert trusted.poll() is None, "the override did not let the consumer start"
        trusted.send_signal(signal.SIGTERM)
        trusted.communicate(timeout=60)
        assert trusted.returncode == 0
    finally:
        _config_everywhere(redis_client, "appendonly", "yes")


def test_park_fsync_always_needs_redis_to_fsync_every_write(
    steps_db: PgSchema,
    services: Services,
    routes: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    """INORDER_PARK_FSYNC=always refuses appendfsync everysec in one line; starts on always."""
    settings = cs.parking_settings_for(
        steps_db, services, routes, "t", "d", redis_prefix, http_port=0
    )
    env = {
        **cs.consumer_env(settings),
        "REDIS_URL": services.redis_url,
        "INORDER_PARK_FSYNC": "always",
    }
    refused = _consumer(env)
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == 2
    assert re.fullmatch(
        re.escape(
            "inorder-consumer: INORDER_PARK_FSYNC=always needs Redis to write every park to "
            "disk before it answers, but "
        )
        + _WHO
        + re.escape(
            " has appendfsync everysec; set appendfsync always in Redis, or "
            "INORDER_PARK_FSYNC=server to accept losing its last second in a machine crash "
            "(the sweeper repairs such losses from the outbox)"
        ),
        err.strip(),
    ), err
    _config_everywhere(redis_client, "appendfsync", "always")
    try:
        started = _consumer(env)
        time.sleep(3)
        assert started.poll() is None, "the consumer did not start on appendfsync always"
        started.send_signal(signal.SIGTERM)
        started.communicate(timeout=60)
        assert started.returncode == 0
    finally:
        _config_everywhere(redis_client, "appendfsync", "everysec")


def test_full_parking_set_sends_events_to_the_held_topic(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Past the cap, early events go to the held topic with the reason; the entity is held."""
    topic, dlq, held = topic_factory("events", 1), topic_factory("dlq"), topic_factory("held")
    routes = tmp_path / "routes.toml"
    routes.write_text(ss.routes_text(max_parked=2))
    settings = cs.parking_settings_for(
        steps_db, services, routes, topic, dlq, redis_prefix, held_topic=held
    )
    with cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, [ss.step(s) for s in (3, 4, 5, 6)])
        letters = drain(services.kafka_bootstrap, held, expect=2)
    assert [decode(m.value()).seq for m in letters] == [5, 6]
    assert {dict(m.headers())[headers.DLQ_REASON] for m in letters} == {b"park_cap_reached"}
    assert ss.progress(steps_db)[2] is True


def test_two_entities_sharing_an_event_id_in_one_batch_both_apply(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    routes: Path,
    redis_prefix: str,
) -> None:
    """Event id dup-1 on entity x seq 2 and entity y seq 2 (ids are unique per source only)."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    settings = cs.parking_settings_for(
        steps_db, services, routes, topic, dlq, redis_prefix, poll_linger_ms=3000
    )
    x2, y2 = (dataclasses.replace(ss.step(2, e), event_id="dup-1") for e in ("x", "y"))
    # One poll batch: both early, parked each with its own bytes; the first steps after.
    with cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, [x2, y2])
        wait_until(lambda: _parked(steps_db) == 2)
        cs.send_events(services.kafka_bootstrap, topic, [ss.step(1, "y"), ss.step(1, "x")])
        wait_until(lambda: (ss.progress(steps_db, "x") or (0, 0))[1] == 2)
        wait_until(lambda: (ss.progress(steps_db, "y") or (0, 0))[1] == 2)
    assert ss.applied(steps_db, "x") == [(1, 1), (1, 2)]
    assert ss.applied(steps_db, "y") == [(1, 1), (1, 2)]
    assert drain(services.kafka_bootstrap, dlq, max_s=5) == []


def _parked(db: PgSchema) -> int:
    with db.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM inorder_step_progress WHERE parked_through IS NOT NULL"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_parked_event_over_a_mebibyte_drains_under_a_raised_limit(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    routes: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    """INORDER_MAX_MESSAGE_BYTES 3 MB: a 1.5 MB early event parks, reads back, and applies."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    settings = cs.parking_settings_for(
        steps_db, services, routes, topic, dlq, redis_prefix, max_message_bytes=3_000_000
    )
    big = dataclasses.replace(ss.step(2), payload={"amount": 2, "pad": "x" * 1_500_000})
    key = ParkingLot(redis_client, settings.redis_key_prefix).entity_key("ledger", "a")
    with cs.running(settings):
        cs.send(services.kafka_bootstrap, topic, [(big.key, encode(big))])
        wait_until(lambda: redis_client.zcard(key) == 1)
        cs.send_events(services.kafka_bootstrap, topic, [ss.step(1)])
        wait_until(lambda: (ss.progress(steps_db) or (0, 0))[1] == 2)
    assert ss.applied(steps_db) == [(1, 1), (1, 2)]
    assert not redis_client.exists(key)


def test_past_the_byte_cap_early_events_are_held_not_parked(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    """max_parked_bytes 500 kB: one 300 kB early event parks, two are held; others park."""
    topic, dlq, held = topic_factory("events", 1), topic_factory("dlq"), topic_factory("held")
    routes = tmp_path / "routes.toml"
    routes.write_text(ss.routes_text().replace("max_parked = 1000", "max_parked_bytes = 500000"))
    settings = cs.parking_settings_for(
        steps_db, services, routes, topic, dlq, redis_prefix, held_topic=held
    )
    big = [
        dataclasses.replace(ss.step(s), payload={"amount": s, "pad": "x" * 300_000})
        for s in (3, 4, 5)
    ]
    lot = ParkingLot(redis_client, settings.redis_key_prefix)
    with cs.running(settings):
        cs.send(services.kafka_bootstrap, topic, [(e.key, encode(e)) for e in big])
        cs.send_events(services.kafka_bootstrap, topic, [ss.step(3, "small")])
        letters = drain(services.kafka_bootstrap, held, expect=2)
        wait_until(lambda: redis_client.zcard(lot.entity_key("ledger", "small")) == 1)
    assert [decode(m.value()).seq for m in letters] == [4, 5]
    assert {dict(m.headers())[headers.DLQ_REASON] for m in letters} == {b"park_cap_reached"}
    assert redis_client.zcard(lot.entity_key("ledger", "a")) == 1
    assert 300_000 < int(redis_client.get(lot.bytes_key("ledger", "a")) or 0) < 500_000
