"""A dead letter Kafka refuses for its size is sent again cut down, never waited on forever."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from consumer import deadletter
from consumer.deadletter import DeadLetter
from schemas import headers
from schemas.topics import replication
from tests.conftest import TopicFactory
from tests.support.kafka import drain
from tests.support.services import Services


def _taken(services: Services, topic: str, key: bytes, value: bytes) -> object:
    """A real message as the consumer takes it: produced, then consumed back."""
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
    producer.produce(topic, value, key, headers=[("trace", b"t" * 5000)])
    assert producer.flush(30) == 0
    reader = Consumer(
        {
            "bootstrap.servers": services.kafka_bootstrap,
            "group.id": f"read-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    reader.subscribe([topic])
    try:
        for _ in range(60):
            for message in reader.consume(1, timeout=1.0):
                if message.error() is None:
                    return message
    finally:
        reader.close()
    raise AssertionError("the message never came back")


def test_a_dead_letter_too_large_for_its_topic_is_cut_to_fit(
    services: Services, topic_factory: TopicFactory, kafka_admin: AdminClient
) -> None:
    """The dead-letter topic takes 40 KB; a 300 KB copy goes again cut to 16 KB, with why."""
    source = topic_factory("source", partitions=1)
    dlq = f"{source}.small-dlq"
    replicas, in_sync = replication(len(kafka_admin.list_topics(timeout=10).brokers))
    config = {"max.message.bytes": "40000", "min.insync.replicas": str(in_sync)}
    created = kafka_admin.create_topics([NewTopic(dlq, 1, replicas, config=config)])
    created[dlq].result(timeout=30)
    try:
        _send_and_check(services, source, dlq)
    finally:
        kafka_admin.delete_topics([dlq])[dlq].result(timeout=30)


def _send_and_check(services: Services, source: str, dlq: str) -> None:
    message = _taken(services, source, b"k" * 20_000, b"v" * 300_000)
    producer = Producer(
        {"bootstrap.servers": services.kafka_bootstrap, "message.max.bytes": 2_000_000}
    )
    deadletter.send(producer, dlq, [DeadLetter(message, "too_large", "big")], 1_000_000)  # type: ignore[arg-type]
    [copy] = drain(services.kafka_bootstrap, dlq, expect=1)
    found = dict(copy.headers() or [])
    assert found[headers.DLQ_REASON] == b"too_large"
    assert found[headers.DLQ_TRUNCATED_FROM] == b"300000"
    assert found[headers.DLQ_TOPIC] == source.encode()
    assert "trace" not in found  # the original's headers are what made it too large
    assert len(copy.value() or b"") == deadletter.MINIMAL_BYTES
    assert len(copy.key() or b"") == deadletter.MINIMAL_BYTES
