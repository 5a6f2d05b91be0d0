"""CloudEvents on the wire against real PostgreSQL, Kafka and Redis: the relay's, and anyone's."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from confluent_kafka import Producer

from consumer import tables
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import relay_support as rs
from tests.integration import step_handlers
from tests.support.kafka import drain, wait_until
from tests.support.services import Services


def test_the_relay_s_cloudevents_read_back_by_the_sdk_and_projected(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """INORDER_ENVELOPE=cloudevents: the SDK reads each row back as itself; a consumer projects."""
    ids = rs.write_rows(outbox, topics.events, 60, entities=6)
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, envelope="cloudevents")
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0)
    read = [
        ce_kafka.from_binary(
            ce_kafka.KafkaMessage(dict(m.headers() or []), m.key(), m.value() or b""),
            JSONFormat(),
        )
        for m in drain(services.kafka_bootstrap, topics.events, expect=60)
    ]
    assert sorted(e.get_id() for e in read) == sorted(ids)
    for event in read:
        entity = event.get_subject()
        assert entity is not None
        assert event.get_id().startswith(f"{entity}:1:")
        assert event.get_type() == "subscription.plan_changed"
        assert event.get_source() == "/inorder/subscription"
        assert event.get_extension("inorderseq") == event.get_id().rsplit(":", 1)[1]
        assert event.get_data() == rs.PAYLOAD
    cs.create_view(outbox)
    routes = tmp_path / "routes.toml"
    routes.write_text(cs.ROUTES)
    dlq = f"{topics.events}.dlq"
    consumer = cs.settings_for(outbox, services.kafka_bootstrap, routes, topics.events, dlq)
    with cs.running(consumer):
        wait_until(
            lambda: (
                len(cs.view(outbox)) == 6 and all(row[1] == 10 for row in cs.view(outbox).values())
            )
        )


def _cloudevent(stream: str, entity: str, seq: int, data: dict[str, Any]) -> CloudEvent:
    return CloudEvent(
        attributes={
            "id": f"{stream}:{entity}:1:{seq}",
            "source": "/somewhere-else",
            "type": f"{stream}.{'added' if stream == 'ledger' else 'plan_changed'}",
            "specversion": "1.0",
            "subject": f"{stream}:{entity}",
            "time": datetime(2026, 12, 1, 10, 0, seq, tzinfo=UTC),
            "inorderseq": str(seq),
            "datacontenttype": "application/json",
            "partitionkey": f"{stream}:{entity}",
        },
        data=data,
    )


def test_a_cloudevents_producer_feeds_a_projection_and_a_step_route(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    redis_client: redis.Redis,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    """SDK CloudEvents (both modes, shuffled, repeated) and envelopes on one topic: all in order."""
    cs.create_view(pg_schema)
    with pg_schema.connect(autocommit=True) as conn:
        tables.migrate(conn)
        conn.execute(step_handlers.TABLE)
    topic, dlq = topic_factory("events", partitions=3), topic_factory("dlq")
    events = [
        _cloudevent(
            "subscription", f"s{n}", seq, {"plan": "pro", "price_cents": seq, "status": "active"}
        )
        for n in range(4)
        for seq in range(1, 6)
    ] + [
        _cloudevent("ledger", f"l{n}", seq, {"amount": seq})
        for n in range(4)
        for seq in range(1, 6)
    ]
    rng = random.Random(5)
    delivered = events + rng.sample(events, 8)
    rng.shuffle(delivered)
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
    for n, event in enumerate(delivered):
        write = ce_kafka.to_binary if n % 2 else ce_kafka.to_structured
        message = write(event, JSONFormat())
        producer.produce(topic, message.value, message.key, headers=list(message.headers.items()))
    assert producer.flush(30) == 0
    # inorder's own envelope on the same topic: one more subscription, read alike.
    cs.send_events(
        services.kafka_bootstrap, topic, [cs.plan_event("s4", q) for q in (2, 1, 3, 5, 4)]
    )
    routes = tmp_path / "routes.toml"
    routes.write_text(
        cs.ROUTES + '\n[[route]]\nstream = "ledger"\nkind = "step"\n[route.handlers]\n'
        '"ledger.added" = "tests.integration.step_handlers:record"\n'
    )
    settings = cs.parking_settings_for(pg_schema, services, routes, topic, dlq, redis_prefix)

    def done() -> bool:
        logged = _steps(pg_schema)
        projected = cs.view(pg_schema)
        return (
            len(projected) == 5
            and all(r[1] == 5 for r in projected.values())
            and all(logged.get(f"l{n}") == [1, 2, 3, 4, 5] for n in range(4))
        )

    with cs.running(settings):
        wait_until(done, timeout_s=60)
    assert {e: [1, 2, 3, 4, 5] for e in (f"l{n}" for n in range(4))} == _steps(pg_schema)


def _steps(schema: PgSchema) -> dict[str, list[int]]:
    with schema.connect() as conn:
        rows = conn.execute("SELECT entity_id, seq FROM applied_steps ORDER BY n").fetchall()
    found: dict[str, list[int]] = {}
    for entity, seq in rows:
        found.setdefault(entity, []).append(int(seq))
    return found
