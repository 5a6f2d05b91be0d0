"""A step route of ``async def`` handlers whose lanes go on past the batch: each entity's
turn a coroutine on the lanes' event loop, on real PostgreSQL, Redis and Kafka.

An entity whose queued events are all awaited steps is read and run on the loop with no
thread; what needs a blocking connection (a gap's parks, a failure, a drain) goes to a
lane's thread. Whatever the path, each step applies once and in order.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from consumer.kinds.steps import StepApplier
from consumer.settings import ConsumerSettings
from schemas import Event
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import step_handlers
from tests.integration import step_support as ss
from tests.support.kafka import wait_until
from tests.support.services import Services

AWAITED = "ledger.awaited"


def _text(function: str = "record_async", lanes: int = 4) -> str:
    extra = (
        f'[route.handlers."{AWAITED}"]\nfunction = "tests.integration.step_handlers:{function}"\n'
    )
    text = ss.routes_text(extra=extra)
    return text.replace('kind = "step"\n', f'kind = "step"\nlanes = {lanes}\n')


def _awaited(seq: int, entity: str) -> Event:
    return ss.step(seq, entity, event_type=AWAITED)


def _carrying(
    client: redis.Redis, prefix: str, schema: PgSchema, function: str = "record_async"
) -> StepApplier:
    """The route with its lanes going on past each batch, as in the consumer's loop."""
    return ss.runner(client, prefix, _text(function), database_url=schema.url, carry=True)


def _applied_count() -> float:
    """Steps the route has counted applied (``events_applied_total``)."""
    return REGISTRY.get_sample_value("events_applied_total", {"route": ss.STREAM}) or 0.0


def _collect(run: StepApplier) -> None:
    """What the lanes finished so far, counted, as the loop does at each poll."""
    carried = run.collect(0.0)
    assert carried.outage is None, carried.outage
    for outcome in carried.outcomes:
        outcome.count(ss.STREAM)


def _parked(client: redis.Redis, run: StepApplier, entity: str) -> list[float]:
    key = run.lot.entity_key(ss.STREAM, entity)
    return [score for _, score in client.zrange(key, 0, -1, withscores=True)]


def test_entities_of_awaited_steps_apply_on_the_loop_without_a_blocking_connection(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """12 entities x 3 awaited steps, a batch per seq: each applies once in order, and no
    lane's thread asked for a connection (every turn read and ran on the loop)."""
    run = _carrying(redis_client, redis_prefix, steps_db)
    entities = [f"l{i:02}" for i in range(12)]
    before = _applied_count()
    try:
        with steps_db.connect(autocommit=True) as conn:
            for seq in (1, 2, 3):
                assert ss.feed(run, conn, [_awaited(seq, e) for e in entities]) == []
                _collect(run)
            assert ss.settle(run) == []
        pool = run.lanes.pool
        assert pool is not None
        assert pool.get_stats().get("requests_num", 0) == 0
    finally:
        run.lanes.close()
    assert _applied_count() - before == 36
    for entity in entities:
        assert ss.applied(steps_db, entity) == [(1, 1), (1, 2), (1, 3)]
        assert ss.progress(steps_db, entity)[:2] == (1, 3)


def test_a_gap_parks_in_the_turn_and_the_step_that_fills_it_drains_the_rest(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Steps 1, 3 and 4, then 2: 3 and 4 park (on a lane's thread); 2 applies on the loop,
    then its park mark sends the turn to drain them: all in order, nothing left parked."""
    run = _carrying(redis_client, redis_prefix, steps_db)
    try:
        with steps_db.connect(autocommit=True) as conn:
            assert ss.feed(run, conn, [_awaited(s, "g") for s in (1, 3, 4)]) == []
            assert ss.settle(run) == []
            assert ss.applied(steps_db, "g") == [(1, 1)]
            assert _parked(redis_client, run, "g") == [3.0, 4.0]
            assert ss.feed(run, conn, [_awaited(2, "g")]) == []
            assert ss.settle(run) == []
    finally:
        run.lanes.close()
    assert ss.applied(steps_db, "g") == [(1, 1), (1, 2), (1, 3), (1, 4)]
    assert _parked(redis_client, run, "g") == []


def test_an_awaited_step_that_raises_stops_its_entity_and_the_others_apply(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """b's step 2 raises on the loop: a lane's thread stops b there, its steps 2 and 3
    parked for a person; every other entity applies in order."""
    run = _carrying(redis_client, redis_prefix, steps_db, "fail_async_for_b")
    entities = [f"f{name}" for name in "abcde"]
    try:
        with steps_db.connect(autocommit=True) as conn:
            assert ss.feed(run, conn, [_awaited(s, e) for e in entities for s in (1, 2, 3)]) == []
            assert ss.settle(run) == []
    finally:
        run.lanes.close()
    for entity in entities:
        if entity == "fb":
            _, last, _, stopped_at, reason = ss.progress(steps_db, entity)
            assert (last, stopped_at) == (1, 2)
            assert "timed out" in reason
            assert ss.applied(steps_db, entity) == [(1, 1)]  # step 2's write rolled back
            assert _parked(redis_client, run, entity) == [2.0, 3.0]
        else:
            assert ss.applied(steps_db, entity) == [(1, 1), (1, 2), (1, 3)]


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_order_duplicates_and_cuts_of_awaited_steps_apply_each_once_in_order(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, data: st.DataObject
) -> None:
    """Awaited steps of 4 entities shuffled, repeated and cut into batches, turns on the loop
    (gaps parking and draining on lanes' threads): each step once, in order, counted once."""
    tag = uuid.uuid4().hex[:8]  # each example its own entities (the schema is shared)
    entities = [f"q{tag}-{i}" for i in range(4)]
    events = [_awaited(seq, entity) for entity in entities for seq in range(1, 5)]
    delivered = data.draw(
        st.permutations(events + data.draw(st.lists(st.sampled_from(events), max_size=8)))
    )
    cuts = sorted(data.draw(st.lists(st.integers(1, len(delivered) - 1), max_size=4, unique=True)))
    run = _carrying(redis_client, redis_prefix, steps_db)
    before = _applied_count()
    try:
        with steps_db.connect(autocommit=True) as conn:
            for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
                assert ss.feed(run, conn, delivered[start:end]) == []
                _collect(run)
            assert ss.settle(run) == []
    finally:
        run.lanes.close()
    assert _applied_count() - before == len(events)
    for entity in entities:
        assert ss.applied(steps_db, entity) == [(1, s) for s in range(1, 5)]
        assert ss.progress(steps_db, entity)[:2] == (1, 4)
        assert _parked(redis_client, run, entity) == []


def _consumer(
    schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    folder: Path,
    prefix: str,
) -> tuple[ConsumerSettings, str]:
    """A consumer's settings for the route of ``gated_call_async``, and its topic (one
    partition)."""
    routes = folder / "routes.toml"
    routes.write_text(_text("gated_call_async"))
    topic, dlq = topic_factory("events", partitions=1), topic_factory("dlq")
    return cs.parking_settings_for(schema, services, routes, topic, dlq, prefix), topic


def test_a_turn_on_the_loop_that_loses_the_database_pauses_and_applies_once_in_order(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Through the consumer: two entities' awaited calls lose their connection, one's call
    fails; the loop waits the outage out, every other step applies once in order, the
    failing entity stops, and the offsets pass them all."""
    settings, topic = _consumer(steps_db, services, topic_factory, tmp_path, redis_prefix)
    entities = ["flaky-a", "flaky-b", "n1", "n2", "boom"]
    events = [_awaited(s, e) for s in (1, 2, 3) for e in entities]
    step_handlers.LOST_ONCE.clear()
    with cs.running(settings):
        cs.send_events(services.kafka_bootstrap, topic, events)
        for entity in entities[:-1]:
            wait_until(lambda e=entity: ss.applied(steps_db, e) == [(1, 1), (1, 2), (1, 3)])
        wait_until(lambda: (ss.progress(steps_db, "boom") or (0, 0, 0, None))[3] == 1)
        wait_until(lambda: cs.committed(settings, topic) == len(events))
    assert sorted(step_handlers.LOST_ONCE) == ["flaky-a", "flaky-b"]
    for entity in entities[:-1]:
        assert ss.progress(steps_db, entity)[:2] == (1, 3)
    assert ss.applied(steps_db, "boom") == []


def test_stopping_waits_for_a_turn_on_the_loop_and_commits_past_it(
    steps_db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Stop while an awaited call hangs: the consumer waits for its turn, then commits past
    it; the turns beside it went on meanwhile."""
    settings, topic = _consumer(steps_db, services, topic_factory, tmp_path, redis_prefix)
    events = [_awaited(1, "slow"), _awaited(1, "n1"), _awaited(2, "slow")]
    step_handlers.GATE.clear()
    step_handlers.GATED.clear()
    try:
        with cs.running(settings):
            cs.send_events(services.kafka_bootstrap, topic, events)
            wait_until(lambda: step_handlers.GATED == [("slow", 1)])
            wait_until(lambda: ss.applied(steps_db, "n1") == [(1, 1)])
            threading.Timer(1.0, step_handlers.GATE.set).start()  # opens while stopping
    finally:
        step_handlers.GATE.set()
    assert ss.applied(steps_db, "slow") == [(1, 1), (1, 2)]
    assert cs.committed(settings, topic) == len(events)
