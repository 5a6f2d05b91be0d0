"""Helpers for consumer tests: a projection table, settings, a consumer in a thread or process."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from consumer import examples
from consumer.routes import parse_routes
from consumer.service import ConsumerService
from consumer.settings import ConsumerSettings
from schemas import Event, encode
from schemas.runtime.health import Health
from tests.conftest import PgSchema
from tests.support.group_protocol import on_protocol
from tests.support.services import Services
from tests.support.threads import serving

BILLING_VIEW = examples.BILLING_VIEW
ROUTES = examples.PROJECTION_ROUTE

PLANS = ("free", "basic", "pro", "enterprise")


def plan_event(entity: str, seq: int, generation: int = 1, plan: str | None = None) -> Event:
    """A full-state subscription event whose plan is derived from its version."""
    plan = plan or PLANS[(generation + seq) % len(PLANS)]
    return Event(
        f"subscription:{entity}:{generation}:{seq}",
        "subscription.plan_changed",
        "subscription",
        entity,
        generation,
        seq,
        "2026-11-30T10:00:00Z",
        "2026-11-30T10:00:01Z",
        {"plan": plan, "price_cents": seq * 100, "status": "active"},
    )


def create_view(schema: PgSchema) -> None:
    """Create the billing_view projection table in the test's schema."""
    with schema.connect(autocommit=True) as conn:
        conn.execute(BILLING_VIEW)


def view(schema: PgSchema) -> dict[str, tuple[Any, ...]]:
    """entity -> (generation, seq, plan, price_cents, status)."""
    with schema.connect() as conn:
        rows = conn.execute(
            "SELECT subscription_id, generation, seq, plan, price_cents, status FROM billing_view"
        ).fetchall()
    return {row[0]: tuple(row[1:]) for row in rows}


def send(bootstrap: str, topic: str, values: list[tuple[bytes | None, bytes | None]]) -> None:
    """Produce (key, value) pairs in order to partition 0 and wait for them."""
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 5_000_000})
    for key, value in values:
        producer.produce(topic, value, key, partition=0)
    assert producer.flush(30) == 0


def send_events(bootstrap: str, topic: str, events: list[Event], *, keyed: bool = True) -> None:
    """Produce events in the given order (to partition 0 unless keyed)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for event in events:
        if keyed:
            producer.produce(topic, encode(event), event.key)
        else:
            producer.produce(topic, encode(event), event.key, partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0


def settings_for(
    schema: PgSchema, bootstrap: str, routes: Path, topic: str, dlq: str, **overrides: Any
) -> ConsumerSettings:
    """Consumer settings pointing at the test's schema, topics and routes file."""
    values: dict[str, Any] = {
        "DATABASE_URL": schema.url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "routes_file": routes,
        "topics": [topic],
        "dead_letter_topic": dlq,
        "group_id": f"consumer-{uuid.uuid4().hex[:8]}",
        "create_topics": False,
        "http_port": 0,
        "poll_timeout_ms": 100,
        **overrides,
    }
    return ConsumerSettings(**on_protocol(values, bootstrap, values["group_id"]))


def parking_settings_for(
    schema: PgSchema,
    services: Services,
    routes: Path,
    topic: str,
    dlq: str,
    prefix: str,
    **overrides: Any,
) -> ConsumerSettings:
    """``settings_for`` with the stack's Redis, parking under the test's ``prefix``."""
    return settings_for(
        schema,
        services.kafka_bootstrap,
        routes,
        topic,
        dlq,
        REDIS_URL=services.redis_url,
        redis_key_prefix=prefix.rstrip(":"),
        **overrides,
    )


def committed(settings: ConsumerSettings, topic: str) -> int:
    """The group's committed offset of ``topic``'s partition 0 (-1001: none)."""
    reader = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": settings.group_id}
    )
    try:
        [where] = reader.committed([TopicPartition(topic, 0)], timeout=10)
        return int(where.offset)
    finally:
        reader.close()


@contextmanager
def running(settings: ConsumerSettings) -> Iterator[ConsumerService]:
    """A consumer serving in a background thread until the block ends."""
    service = ConsumerService(settings, parse_routes(settings.routes_file.read_text()), Health())
    with serving("consumer", service.run, service.stop):
        yield service


def consumer_env(settings: ConsumerSettings) -> dict[str, str]:
    """Environment for an ``inorder-consumer`` process with the same settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    env.update(
        DATABASE_URL=settings.database_url.get_secret_value(),
        KAFKA_BOOTSTRAP_SERVERS=settings.kafka_bootstrap_servers,
        INORDER_ROUTES_FILE=str(settings.routes_file),
        INORDER_TOPICS=f'["{settings.topics[0]}"]',
        INORDER_DEAD_LETTER_TOPIC=settings.dead_letter_topic,
        INORDER_GROUP_ID=settings.group_id,
        INORDER_CREATE_TOPICS="false",
        INORDER_HTTP_PORT=str(settings.http_port),
        INORDER_POLL_MAX_MESSAGES=str(settings.poll_max_messages),
        INORDER_KAFKA_EXTRA=orjson.dumps(settings.kafka_extra).decode(),
        INORDER_REDIS_KEY_PREFIX=settings.redis_key_prefix,
    )
    if settings.redis_url is not None:
        env["REDIS_URL"] = settings.redis_url.get_secret_value()
    if settings.kafka_group_protocol is not None:
        env["INORDER_KAFKA_GROUP_PROTOCOL"] = settings.kafka_group_protocol
    return env


def spawn(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``inorder-consumer`` as its own process, its log lines appended to ``log``."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "consumer"], env=env, stdout=sink, stderr=sink
        )
