"""The relay against real PostgreSQL and Kafka: delivery, concurrency, crashes, repair."""

from __future__ import annotations

import signal
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

import schemas
from outbox_relay import store
from schemas import headers
from schemas.outbox import OutboxEvent, emit_many
from schemas.republish import RepublishRequest, decode_result, encode
from schemas.topics import replication
from tests.conftest import PgSchema
from tests.integration import relay_support as rs
from tests.support.kafka import drain, wait_until
from tests.support.services import Services


def _event_ids(services: Services, topic: str, expect: int) -> Counter[str]:
    messages = drain(services.kafka_bootstrap, topic, expect=expect)
    return Counter(schemas.decode(m.value()).event_id for m in messages)


def test_every_committed_row_arrives_exactly_once(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """With one relay, each committed row is delivered once, keyed by entity, and counted sent."""
    ids = rs.write_rows(outbox, topics.events, 600)
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, read_rows=100)
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0)
    assert rs.count_rows(outbox, rs.SENT) == 600
    messages = drain(services.kafka_bootstrap, topics.events, expect=600)
    assert Counter(schemas.decode(m.value()).event_id for m in messages) == Counter(ids)
    first = messages[0]
    event = schemas.decode(first.value())
    assert first.key() == event.key
    assert (headers.EVENT_TYPE, b"subscription.plan_changed") in first.headers()


def test_one_relay_publishes_each_entity_in_seq_order(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """Over many batches, each read while the one before is in flight, seqs stay in order."""
    rs.write_rows(outbox, topics.events, 3000, entities=40)
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, read_rows=100)
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0, timeout_s=90)
    seqs: dict[str, list[int]] = {}
    for message in drain(services.kafka_bootstrap, topics.events, expect=3000):
        event = schemas.decode(message.value())
        seqs.setdefault(event.entity_id, []).append(event.seq)
    assert len(seqs) == 40
    assert all(found == list(range(1, 76)) for found in seqs.values())


def test_two_relays_publish_every_row_once(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """Two relays share the slices of one outbox: every row arrives, once."""
    ids = rs.write_rows(outbox, topics.events, 4000, entities=50)
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, read_rows=200)
    with rs.running(settings), rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0, timeout_s=90)
    assert _event_ids(services, topics.events, 4000) == Counter(ids)


def test_kill_9_mid_batch_loses_nothing(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """A relay killed with SIGKILL while publishing loses no row; a new relay finishes the job."""
    total = 30_000
    ids = rs.write_rows(outbox, topics.events, total, entities=300)
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, read_rows=50)
    env = rs.relay_env(settings)
    first = rs.spawn(env, tmp_path / "relay.log")
    wait_until(lambda: _in_kafka(services, topics.events) > 0, timeout_s=60, interval_s=0.005)
    first.kill()
    first.wait(timeout=30)
    assert rs.unsent(outbox) > 0, "killed too late to test a crash"

    second = rs.spawn(env, tmp_path / "relay.log")
    try:
        wait_until(lambda: rs.unsent(outbox) == 0, timeout_s=120)
    finally:
        second.terminate()
        second.wait(timeout=60)
    seen = _event_ids(services, topics.events, total)
    assert set(seen) == set(ids)


def _in_kafka(services: Services, topic: str) -> int:
    """Messages in the topic so far (the partitions' end offsets)."""
    reader = Consumer({"bootstrap.servers": services.kafka_bootstrap, "group.id": "ends"})
    try:
        parts = reader.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts
        )
    finally:
        reader.close()


def _request(services: Services, topic: str, request: RepublishRequest) -> None:
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
    producer.produce(topic, encode(request), request.key)
    assert producer.flush(30) == 0


def test_republish_resends_exactly_the_range_and_names_what_is_gone(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """A request re-sends exactly its range; after a purge the answer lists the missing seqs."""
    rs.write_rows(outbox, topics.events, 10, entities=1)
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, republish_cooldown_s=0)
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0)
        _request(
            services,
            topics.requests,
            RepublishRequest("req-1", "subscription", "s0", 1, 3, 7, "gap"),
        )
        [answer] = [
            decode_result(m.value())
            for m in drain(services.kafka_bootstrap, topics.results, expect=1)
        ]
        with outbox.connect() as conn:
            conn.execute("DELETE FROM outbox WHERE seq <= 4")
        _request(
            services,
            topics.requests,
            RepublishRequest("req-2", "subscription", "s0", 1, 1, 12, "gap"),
        )
        answers = [
            decode_result(m.value())
            for m in drain(services.kafka_bootstrap, topics.results, expect=2)
        ]

    assert (answer.request_id, answer.resent, answer.missing, answer.cooldown) == (
        "req-1",
        (3, 4, 5, 6, 7),
        (),
        False,
    )
    second = answers[1]
    assert (second.resent, second.missing, second.failed) == (
        (5, 6, 7, 8, 9, 10),
        (1, 2, 3, 4, 11, 12),
        (),
    )
    resent = [
        (dict(m.headers())[headers.REPUBLISH_REQUEST], schemas.decode(m.value()).seq)
        for m in drain(services.kafka_bootstrap, topics.events, expect=21)
        if headers.REPUBLISH_REQUEST in dict(m.headers())
    ]
    assert sorted(resent) == [(b"req-1", s) for s in range(3, 8)] + [
        (b"req-2", s) for s in range(5, 11)
    ]


def test_repeated_request_within_cooldown_resends_nothing(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """The same range asked twice within the cool-down is answered, but re-sent only once."""
    rs.write_rows(outbox, topics.events, 5, entities=1)
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, republish_cooldown_s=600)
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0)
        for request_id in ("a", "b"):
            _request(
                services,
                topics.requests,
                RepublishRequest(request_id, "subscription", "s0", 1, 1, 5, "gap"),
            )
        answers = [
            decode_result(m.value())
            for m in drain(services.kafka_bootstrap, topics.results, expect=2)
        ]
    assert [(a.request_id, a.resent, a.cooldown) for a in answers] == [
        ("a", (1, 2, 3, 4, 5), False),
        ("b", (), True),
    ]
    assert len(drain(services.kafka_bootstrap, topics.events, expect=10)) == 10


def test_row_that_cannot_be_sent_is_failed_and_blocks_nothing(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """A bad hand-written row is failed with a reason, rows after it go; corrected, it is sent."""
    rs.write_rows(outbox, topics.events, 3, entities=3)
    with outbox.connect() as conn:
        conn.execute(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id,"
            " payload) VALUES (%s, 'subscription', 'bad', 1, 'subscription.plan_changed', 'bad-1', "
            '\'{"plan": "platinum"}\')',
            (topics.events,),
        )
    rs.write_rows(outbox, topics.events, 3, entities=3, start_seq=2)
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0)
    with outbox.connect() as conn:
        failed = conn.execute(
            "SELECT event_id, failure_reason FROM outbox WHERE failed_at IS NOT NULL"
        ).fetchall()
    assert len(failed) == 1
    assert failed[0][0] == "bad-1"
    assert "price_cents" in failed[0][1] or "plan: breaks `enum`" in failed[0][1]
    assert "platinum" not in failed[0][1]  # the rule is named, the payload never quoted
    assert rs.count_rows(outbox, rs.SENT) == 6
    sent = _event_ids(services, topics.events, 6)
    assert len(sent) == 6
    assert "bad-1" not in sent

    with outbox.connect() as conn:  # the runbook's way back for a corrected row
        conn.execute(
            "UPDATE outbox SET payload = %s, failed_at = NULL, failure_reason = NULL"
            " WHERE event_id = 'bad-1'",
            (orjson.dumps(rs.PAYLOAD).decode(),),
        )
        conn.execute("INSERT INTO outbox_resend SELECT id FROM outbox WHERE event_id = 'bad-1'")
    with rs.running(settings):
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 7)
    assert _event_ids(services, topics.events, 7)["bad-1"] == 1


def test_notify_wakes_the_relay_long_before_its_poll(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """With a 10-minute poll, a committed row is still published promptly: NOTIFY woke the relay."""
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, poll_interval_s=600)
    with rs.running(settings):
        time.sleep(1.0)  # let it go idle, waiting for the next poll
        rs.write_rows(outbox, topics.events, 1)
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 1, timeout_s=20)


def test_polling_alone_publishes_when_notifications_are_off(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """Without LISTEN the fallback poll still finds new rows."""
    settings = rs.settings_for(outbox, services.kafka_bootstrap, topics, poll_interval_s=0.3)
    with rs.running(settings, listen=False):
        time.sleep(0.5)
        rs.write_rows(outbox, topics.events, 5)
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 5)


def test_retention_deletes_only_old_sent_rows(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """Sent rows created before the retention window go; recent rows and failed rows stay."""
    rs.write_rows(outbox, topics.events, 30, entities=3)
    with outbox.connect() as conn:
        conn.execute("UPDATE outbox SET created_at = now() - interval '3 hours' WHERE seq <= 4")
        conn.execute(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id,"
            " payload, created_at) VALUES (%s, 'subscription', 'bad', 1,"
            " 'subscription.plan_changed', 'bad-1', '{\"plan\": 1}', now() - interval '3 hours')",
            (topics.events,),
        )
    settings = rs.settings_for(
        outbox,
        services.kafka_bootstrap,
        topics,
        retention_s=3600,
        purge_interval_s=0.5,
        purge_batch_rows=2,
        gap_deadline_s=60,
        republish_backoff_base_s=10,
        republish_max_attempts=2,
    )
    with rs.running(settings):
        wait_until(lambda: rs.count_rows(outbox) == 19)
        assert rs.unsent(outbox) == 0
    assert rs.count_rows(outbox, "seq <= 4") == 1  # the failed row
    assert rs.count_rows(outbox, "failed_at IS NOT NULL") == 1


def test_kafka_unreachable_leaves_rows_pending_and_not_ready(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """With no broker, rows stay unpublished and the relay reports Kafka as its problem."""
    rs.write_rows(outbox, topics.events, 5)
    settings = rs.settings_for(
        outbox, f"127.0.0.1:{rs.free_port()}", topics, delivery_timeout_ms=1000
    )
    with rs.running(settings) as relay:
        wait_until(lambda: "kafka" in relay.health.problems, timeout_s=30)
        assert rs.unsent(outbox) == 5
    assert rs.count_rows(outbox, rs.SENT) == 0


def test_sigterm_finishes_the_batch_and_exits_zero(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """SIGTERM stops the process with exit 0; a second relay sends whatever is left."""
    ids = rs.write_rows(outbox, topics.events, 20_000, entities=100)
    port = rs.free_port()
    settings = rs.settings_for(
        outbox, services.kafka_bootstrap, topics, read_rows=500, http_port=port
    )
    log = tmp_path / "relay.log"
    process = rs.spawn(rs.relay_env(settings), log)
    wait_until(lambda: rs.count_rows(outbox, rs.SENT) > 0, timeout_s=60, interval_s=0.02)
    for path, expected in (
        ("/healthz", b"ok"),
        ("/readyz", b"ready"),
        ("/metrics", b"outbox_published_total"),
    ):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            assert expected in response.read()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert '"relay_stopped"' in log.read_text()

    with rs.running(settings):
        wait_until(lambda: rs.unsent(outbox) == 0, timeout_s=90)
    assert set(_event_ids(services, topics.events, len(ids))) == set(ids)


def test_missing_outbox_table_pauses_instead_of_crashing(
    pg_schema: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """Before migrations the relay waits, not ready: its schema, by a code (the log says more)."""
    settings = rs.settings_for(pg_schema, services.kafka_bootstrap, topics)
    with rs.running(settings) as relay:
        problems = wait_until(lambda: relay.health.problems.get("postgres"), timeout_s=20)
    assert problems == "schema_not_ready"


def test_ensure_topics_creates_only_missing_topics(services: Services, kafka_admin) -> None:
    """ensure_topics creates what is missing, once, replicated as the broker count allows."""
    from schemas.topics import ensure_topics  # noqa: PLC0415

    name = f"t.ensure.{uuid.uuid4().hex[:8]}"
    config = {"bootstrap.servers": services.kafka_bootstrap}
    try:
        assert ensure_topics(config, [name], 2) == [name]
        assert ensure_topics(config, [name], 2) == []
        topic = kafka_admin.list_topics(name, timeout=10).topics[name]
        assert len(topic.partitions) == 2
        brokers = len(kafka_admin.list_topics(timeout=10).brokers)
        assert {len(p.replicas) for p in topic.partitions.values()} == {min(3, brokers)}
        [config] = kafka_admin.describe_configs([ConfigResource("topic", name)]).values()
        expected = "2" if brokers >= 3 else "1"
        assert config.result(timeout=30)["min.insync.replicas"].value == expected
    finally:
        kafka_admin.delete_topics([name])[name].result(timeout=30)


def test_a_row_for_a_missing_topic_holds_nothing_and_goes_once_the_topic_exists(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, kafka_admin: AdminClient
) -> None:
    """Seq 1 names a topic not there yet: set aside, seq 2 (same slice) sent; then seq 1.

    Set aside is not failed: the failed-rows count stays 0, and a republish request for
    both seqs calls seq 1 neither lost nor failed.
    """
    later = f"{topics.events}.later"
    with outbox.connect() as conn, conn.transaction():
        emit_many(
            conn,
            [
                OutboxEvent("subscription", "m1", 1, "subscription.plan_changed", rs.PAYLOAD,
                            topic=later),
                OutboxEvent("subscription", "m1", 2, "subscription.plan_changed", rs.PAYLOAD,
                            topic=topics.events),
            ],
        )  # fmt: skip
    settings = rs.settings_for(
        outbox, services.kafka_bootstrap, topics, lease_s=3, republish_cooldown_s=0
    )
    with rs.running(settings):
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 1)
        assert rs.count_rows(outbox, "failure_reason LIKE 'awaiting_topic:%'") == 1
        assert rs.unsent(outbox) == 1
        with outbox.connect() as conn:
            assert store.failed_rows(conn) == (0, 1)
        request = RepublishRequest("req-aside", "subscription", "m1", 1, 1, 2, "gap")
        _request(services, topics.requests, request)
        [answer] = [
            decode_result(m.value())
            for m in drain(services.kafka_bootstrap, topics.results, expect=1)
        ]
        assert (answer.resent, answer.missing, answer.failed) == ((2,), (), ())
        assert _event_ids(services, topics.events, 2) == Counter({"subscription:m1:1:2": 2})
        replicas, in_sync = replication(len(kafka_admin.list_topics(timeout=10).brokers))
        config = {"min.insync.replicas": str(in_sync)}
        made = kafka_admin.create_topics([NewTopic(later, 1, replicas, config=config)])
        made[later].result(timeout=30)
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 2, timeout_s=60)
    assert rs.count_rows(outbox, "failed_at IS NOT NULL") == 0
    [message] = drain(services.kafka_bootstrap, later, expect=1)
    assert schemas.decode(message.value()).seq == 1
    kafka_admin.delete_topics([later])[later].result(timeout=30)


def test_a_row_whose_topic_never_comes_is_failed_past_its_grace_and_sent_if_it_comes(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, kafka_admin: AdminClient
) -> None:
    """Set aside, then failed unknown_topic once the grace is over; the topic made later: sent."""
    later = f"{topics.events}.late"
    with outbox.connect() as conn, conn.transaction():
        emit_many(
            conn,
            [OutboxEvent("subscription", "m2", 1, "subscription.plan_changed", rs.PAYLOAD,
                         topic=later)],
        )  # fmt: skip
    settings = rs.settings_for(
        outbox, services.kafka_bootstrap, topics, lease_s=3, unknown_topic_grace_s=2
    )
    with rs.running(settings):
        wait_until(lambda: rs.count_rows(outbox, "failure_reason LIKE 'unknown_topic:%'") == 1)
        assert rs.unsent(outbox) == 0
        with outbox.connect() as conn:
            assert store.failed_rows(conn) == (1, 0)
        replicas, in_sync = replication(len(kafka_admin.list_topics(timeout=10).brokers))
        config = {"min.insync.replicas": str(in_sync)}
        made = kafka_admin.create_topics([NewTopic(later, 1, replicas, config=config)])
        made[later].result(timeout=30)
        wait_until(lambda: rs.count_rows(outbox, rs.SENT) == 1, timeout_s=60)
    [message] = drain(services.kafka_bootstrap, later, expect=1)
    assert schemas.decode(message.value()).entity_id == "m2"
    kafka_admin.delete_topics([later])[later].result(timeout=30)
