"""Each real service works end to end through the fixtures."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.conftest import PgSchema, TopicFactory
from tests.support.services import STACK_SCRIPT, Services


def _consume_all(consumer: Consumer, want: int, timeout_s: float = 30.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for message in consumer.consume(num_messages=want, timeout=0.5):
            assert message.error() is None, message.error()
            got.append(message.value())
    return got


def test_kafka_group_consumes_and_commits(services: Services, topic_factory: TopicFactory) -> None:
    """Messages produced to a topic are consumed by a group whose commit is then stored."""
    topic = topic_factory(partitions=1)
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap, "enable.idempotence": True})
    sent = [f"m{i}".encode() for i in range(10)]
    for value in sent:
        producer.produce(topic, value=value, key=b"k")
    assert producer.flush(30) == 0

    group = f"g-{uuid.uuid4().hex[:8]}"
    config = {
        "bootstrap.servers": services.kafka_bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    consumer = Consumer(config)
    consumer.subscribe([topic])
    assert _consume_all(consumer, len(sent)) == sent
    consumer.commit(asynchronous=False)
    consumer.close()

    checker = Consumer(config)
    [committed] = checker.committed([TopicPartition(topic, 0)], timeout=30)
    checker.close()
    assert committed.offset == len(sent)


def test_postgres_upsert_keeps_newer_version(pg_schema: PgSchema) -> None:
    """A conditional upsert writes a newer version and leaves an older one unchanged."""
    upsert = (
        "INSERT INTO plans (id, plan, version) VALUES (%s, %s, %s) "
        "ON CONFLICT (id) DO UPDATE SET plan = EXCLUDED.plan, version = EXCLUDED.version "
        "WHERE plans.version < EXCLUDED.version"
    )
    with pg_schema.connect() as conn:
        conn.execute("CREATE TABLE plans (id text PRIMARY KEY, plan text, version int)")
        conn.execute(upsert, ("s1", "pro", 8))
        stale = conn.execute(upsert, ("s1", "basic", 7)).rowcount
        row = conn.execute("SELECT plan, version FROM plans WHERE id = 's1'").fetchone()
    assert stale == 0
    assert row == ("pro", 8)


def test_redis_sorted_set_range_by_score(redis_client: redis.Redis, redis_prefix: str) -> None:
    """ZADD then ZRANGEBYSCORE returns members in score order within the range."""
    key = f"{redis_prefix}parked"
    redis_client.zadd(key, {"e9": 9, "e7": 7, "e8": 8, "e12": 12})
    assert redis_client.zrangebyscore(key, 7, 9) == [b"e7", b"e8", b"e9"]


def test_redis_key_survives_restart_through_aof(
    services: Services, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """A key written before a Redis restart is there afterwards, with AOF the only persistence."""
    assert redis_client.config_get("appendonly") == {"appendonly": "yes"}
    assert redis_client.config_get("save") == {"save": ""}
    key = f"{redis_prefix}durable"
    redis_client.zadd(key, {"e8": 8})

    services.restart("redis")

    after = redis.Redis.from_url(services.redis_url)
    try:
        assert after.zrange(key, 0, -1, withscores=True) == [(b"e8", 8.0)]
    finally:
        after.close()


def test_stack_up_when_running_is_a_no_op(services: Services) -> None:
    """A second `stack up` finds every service answering and starts nothing."""
    if not os.environ.get("INORDER_STACK_DIR"):
        pytest.skip("services are not from deploy/local/stack")
    done = subprocess.run([str(STACK_SCRIPT), "up"], capture_output=True, text=True, check=True)
    assert done.stderr.count("already running") == 3, done.stderr


def test_stack_remembers_the_ports_it_was_started_with(tmp_path: Path) -> None:
    """A stack started on a moved port is found by env and status in a shell without the port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    state = tmp_path / "stack"
    bare = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    bare["INORDER_STACK_DIR"] = str(state)
    started = {**bare, "INORDER_REDIS_PORT": str(port)}
    subprocess.run([str(STACK_SCRIPT), "up", "redis"], env=started, check=True, capture_output=True)
    try:
        env = subprocess.run(
            [str(STACK_SCRIPT), "env"], env=bare, check=True, capture_output=True, text=True
        ).stdout
        status = subprocess.run(
            [str(STACK_SCRIPT), "status"], env=bare, capture_output=True, text=True, check=False
        ).stdout
    finally:
        subprocess.run([str(STACK_SCRIPT), "down", "redis"], env=bare, check=True)
    assert f"export REDIS_URL=redis://127.0.0.1:{port}/0" in env
    assert f"export INORDER_REDIS_PORT={port}" in env
    assert "redis: up" in status
