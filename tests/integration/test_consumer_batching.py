"""Adaptive batching: a quiet topic is applied event by event, a backlog in full batches.

The assertions are on the batch sizes the consumer reports (``consumer_batch_size``),
never on how long anything took.
"""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY

from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.support.kafka import wait_until
from tests.support.services import Services


def _batches() -> tuple[int, int]:
    """(batches taken, messages in them) so far, as the consumer reports them."""
    count = REGISTRY.get_sample_value("consumer_batch_size_count") or 0.0
    total = REGISTRY.get_sample_value("consumer_batch_size_sum") or 0.0
    return int(count), int(total)


def _since(before: tuple[int, int]) -> tuple[int, int]:
    count, total = _batches()
    return count - before[0], total - before[1]


def _two_events_half_a_second_apart(
    view: PgSchema, services: Services, topic_factory: TopicFactory, routes: Path, linger_ms: int
) -> tuple[int, int]:
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq", partitions=1)
    settings = cs.settings_for(
        view,
        services.kafka_bootstrap,
        routes,
        topic,
        dlq,
        poll_max_messages=500,
        poll_timeout_ms=1000,
        poll_linger_ms=linger_ms,
    )
    with cs.running(settings) as service:
        wait_until(lambda: not service.health.problems)
        before = _batches()
        cs.send_events(services.kafka_bootstrap, topic, [cs.plan_event("quiet-a", 1)])
        time.sleep(0.5)
        cs.send_events(services.kafka_bootstrap, topic, [cs.plan_event("quiet-b", 1)])
        wait_until(lambda: {"quiet-a", "quiet-b"} <= set(cs.view(view)))
        return _since(before)


def test_events_on_a_quiet_topic_are_applied_one_batch_each(
    view: PgSchema, services: Services, topic_factory: TopicFactory, routes: Path
) -> None:
    """Two events sent half a second apart make two batches of one: none waits for the other."""
    assert _two_events_half_a_second_apart(view, services, topic_factory, routes, 0) == (2, 2)


def test_batch_linger_holds_a_batch_open_for_the_next_event(
    view: PgSchema, services: Services, topic_factory: TopicFactory, routes: Path
) -> None:
    """With INORDER_POLL_LINGER_MS the same two events share one batch: it waited to fill."""
    assert _two_events_half_a_second_apart(view, services, topic_factory, routes, 5000) == (1, 2)


def test_a_backlog_is_taken_in_full_batches(
    view: PgSchema, services: Services, topic_factory: TopicFactory, routes: Path
) -> None:
    """300 events waiting before start-up are applied in batches of up to 100, not one by one."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq", partitions=1)
    events = [cs.plan_event(f"backlog-{i}", 1) for i in range(300)]
    cs.send_events(services.kafka_bootstrap, topic, events)
    settings = cs.settings_for(
        view,
        services.kafka_bootstrap,
        routes,
        topic,
        dlq,
        poll_max_messages=100,
        poll_timeout_ms=1000,
    )
    before = _batches()
    with cs.running(settings):
        wait_until(lambda: len(cs.view(view)) == 300)
        batches, messages = _since(before)
    assert messages == 300
    assert batches <= 6


def test_offsets_are_committed_when_the_consumer_falls_idle(
    view: PgSchema, services: Services, topic_factory: TopicFactory, routes: Path
) -> None:
    """With a minute between commits, the offset of the last batch is committed once idle."""
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq", partitions=1)
    settings = cs.settings_for(
        view, services.kafka_bootstrap, routes, topic, dlq, commit_interval_ms=60_000
    )
    probe = Consumer({"bootstrap.servers": services.kafka_bootstrap, "group.id": settings.group_id})
    try:
        with cs.running(settings) as service:
            wait_until(lambda: not service.health.problems)
            cs.send_events(services.kafka_bootstrap, topic, [cs.plan_event("idle-a", 1)])
            wait_until(lambda: "idle-a" in cs.view(view))
            cs.send_events(services.kafka_bootstrap, topic, [cs.plan_event("idle-b", 1)])
            wait_until(lambda: "idle-b" in cs.view(view))
            wait_until(
                lambda: probe.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 2
            )
    finally:
        probe.close()
