"""Step lanes against real PostgreSQL and Redis: many entities' external calls at once, in order."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from itertools import pairwise

import psycopg
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer.errors import RoutesError
from consumer.kinds.steps import StepApplier
from consumer.kinds.steps.lanes import Lanes
from consumer.routes import parse_routes
from schemas.runtime import postgres
from tests.conftest import PgSchema
from tests.integration import step_handlers
from tests.integration import step_support as ss

SLOW = (
    '[route.handlers."ledger.mailed"]\n'
    'function = "tests.integration.step_handlers:slow_call"\nexternal = true\n'
)


ASYNC = (
    '[route.handlers."ledger.awaited"]\nfunction = "tests.integration.step_handlers:{function}"\n'
)


def _text(lanes: int, *, idempotent: bool = True, function: str = "slow_call") -> str:
    extra = SLOW.replace("slow_call", function) + ("idempotent = true\n" if idempotent else "")
    return ss.routes_text(extra=extra).replace(
        'kind = "step"\n', f'kind = "step"\nlanes = {lanes}\n'
    )


def test_lanes_call_out_for_many_entities_at_once_each_entity_in_order(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """8 lanes, 24 entities x 3 slow external steps: calls overlap, each entity's run in order."""
    run = ss.runner(redis_client, redis_prefix, _text(8), database_url=steps_db.url)
    entities = [f"e{i:02}" for i in range(24)]
    events = [ss.step(s, e, event_type="ledger.mailed") for e in entities for s in (1, 2, 3)]
    step_handlers.SLOW_CALLS.clear()
    with steps_db.connect(autocommit=True) as conn:
        assert ss.feed(run, conn, events[::-1]) == []
    for entity in entities:
        assert ss.applied(steps_db, entity) == [(1, 1), (1, 2), (1, 3)]
    calls = step_handlers.SLOW_CALLS
    assert sorted((e, s) for e, s, _, _ in calls) == sorted((e.entity_id, e.seq) for e in events)
    # At some moment several calls were in flight together (lanes), never two of one entity.
    most = max(sum(1 for _, _, a, b in calls if a <= at < b) for _, _, at, _ in calls)
    assert most > 1
    for entity in entities:
        spans = sorted((a, b) for e, _, a, b in calls if e == entity)
        assert all(b1 <= a2 for (_, b1), (a2, _) in pairwise(spans))
    pool = run.lanes.pool
    assert pool is not None
    assert 1 <= pool.get_stats()["pool_size"] <= 8  # a connection per lane at most
    run.lanes.close()
    assert pool.closed
    assert run.lanes.pool is None


def test_a_route_without_lanes_opens_no_connection_of_its_own(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """lanes = 1 (the default) applies on the consumer's connection, one entity after another."""
    run = ss.runner(redis_client, redis_prefix, _text(1), database_url=steps_db.url)
    events = [ss.step(1, e, event_type="ledger.mailed") for e in ("a", "b", "c")]
    with steps_db.connect(autocommit=True) as conn:
        assert ss.feed(run, conn, events) == []
    assert run.lanes.pool is None
    assert [ss.applied(steps_db, e) for e in ("a", "b", "c")] == [[(1, 1)]] * 3


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_order_duplicates_cuts_and_lane_count_give_the_one_lane_step_log(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, data: st.DataObject
) -> None:
    """External, awaited and plain steps of 6 entities, shuffled, repeated, cut, lanes going
    on past their batch or not: each step once, in order."""
    tag = uuid.uuid4().hex[:8]  # each example its own entities (the schema is shared)
    lanes = data.draw(st.sampled_from([1, 2, 4, 16]))
    carry = data.draw(st.booleans())
    entities = [f"p{tag}-{i}" for i in range(6)]
    kinds = data.draw(
        st.lists(
            st.sampled_from(["ledger.mailed", "ledger.added", "ledger.awaited"]),
            min_size=5,
            max_size=5,
        )
    )
    events = [
        ss.step(seq, entity, event_type=event_type)
        for entity in entities
        for seq, event_type in enumerate(kinds, 1)
    ]
    delivered = data.draw(
        st.permutations(events + data.draw(st.lists(st.sampled_from(events), max_size=10)))
    )
    cuts = sorted(data.draw(st.lists(st.integers(1, len(delivered) - 1), max_size=4, unique=True)))
    text = _text(lanes, function="call_out") + ASYNC.format(function="record_async")
    run = ss.runner(redis_client, redis_prefix, text, database_url=steps_db.url, carry=carry)
    try:
        with steps_db.connect(autocommit=True) as conn:
            for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
                assert ss.feed(run, conn, delivered[start:end]) == []
                run.collect(0.0)  # as the loop does at each poll
            assert ss.settle(run) == []
    finally:
        run.lanes.close()
    for entity in entities:
        assert ss.applied(steps_db, entity) == [(1, s) for s in range(1, 6)]
        assert ss.progress(steps_db, entity)[:2] == (1, 5)


def test_an_unfinished_attempt_in_a_lane_stops_only_its_entity_for_review(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """4 lanes, not idempotent: entities with an unfinished attempt stop, the rest apply once."""
    text = _text(4, idempotent=False, function="call_out")
    run = ss.runner(redis_client, redis_prefix, text, database_url=steps_db.url)
    entities = [f"r{i}" for i in range(10)]
    interrupted = {"r3", "r7"}
    with steps_db.connect(autocommit=True) as conn:
        for entity in sorted(interrupted):  # as if a consumer died during these calls
            conn.execute(
                "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id) "
                "VALUES ('ledger', %s, 1, 1, %s)",
                (entity, f"{entity}:1:1"),
            )
        step_handlers.CALLS.clear()
        events = [ss.step(s, e, event_type="ledger.mailed") for e in entities for s in (1, 2)]
        assert ss.feed(run, conn, events) == []
    run.lanes.close()
    assert sorted(step_handlers.CALLS) == sorted(
        (e, s) for e in entities if e not in interrupted for s in (1, 2)
    )
    for entity in entities:
        if entity in interrupted:
            _, last, _, stopped_at, reason = ss.progress(steps_db, entity)
            assert (last, stopped_at) == (0, 1)
            assert reason.startswith("needs_review")
        else:
            assert ss.applied(steps_db, entity) == [(1, 1), (1, 2)]


def test_a_route_without_lanes_takes_the_consumer_s_step_lanes(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """INORDER_STEP_LANES = 4 gives a route that sets no lanes four lanes; its steps apply."""
    text = SLOW.replace("slow_call", "call_out") + "idempotent = true\n"
    run = ss.runner(
        redis_client,
        redis_prefix,
        ss.routes_text(extra=text),
        database_url=steps_db.url,
        step_lanes=4,
    )
    assert run.route.lanes is None
    assert (run.lanes.size, run.lanes.pool is not None) == (4, True)
    events = [ss.step(1, e, event_type="ledger.mailed") for e in ("sa", "sb", "sc", "sd")]
    with steps_db.connect(autocommit=True) as conn:
        assert ss.feed(run, conn, events) == []
    run.lanes.close()
    assert [ss.applied(steps_db, e) for e in ("sa", "sb", "sc", "sd")] == [[(1, 1)]] * 4


def _async_text(lanes: int, function: str = "slow_call_async", *, external: bool = False) -> str:
    extra = ASYNC.format(function=function) + ("external = true\n" if external else "")
    text = ss.routes_text(extra=extra)
    return text.replace('kind = "step"\n', f'kind = "step"\nlanes = {lanes}\n')


def test_async_handlers_are_awaited_concurrently_each_entity_in_order(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """async def steps of 16 entities, 8 lanes: awaited together, each entity's in seq order."""
    run = ss.runner(redis_client, redis_prefix, _async_text(8), database_url=steps_db.url)
    entities = [f"a{i:02}" for i in range(16)]
    # Plain steps around the awaited one: an entity's run mixes both kinds, in order.
    kinds = {1: "ledger.added", 2: "ledger.awaited", 3: "ledger.added", 4: "ledger.awaited"}
    events = [ss.step(s, e, event_type=kinds[s]) for e in entities for s in kinds]
    step_handlers.ASYNC_CALLS.clear()
    with steps_db.connect(autocommit=True) as conn:
        assert ss.feed(run, conn, events[::-1]) == []
    run.lanes.close()
    for entity in entities:
        assert ss.applied(steps_db, entity) == [(1, 1), (1, 2), (1, 3), (1, 4)]
    calls = step_handlers.ASYNC_CALLS
    assert sorted((e, s) for e, s, _, _ in calls) == sorted(
        (e, s) for e in entities for s in (2, 4)
    )
    most = max(sum(1 for _, _, a, b in calls if a <= at < b) for _, _, at, _ in calls)
    assert most > 1


@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize("kind", ["external", "async"])
def test_a_handler_that_raises_stops_its_entity_and_the_lanes_go_on(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, lanes: int, kind: str
) -> None:
    """b's step 2 raises (called or awaited): b stops there, rolled back; the others apply."""
    if kind == "external":
        text, event_type, error = _text(lanes, function="call_out_unless_b"), "ledger.mailed", "503"
    else:
        text, event_type, error = (
            _async_text(lanes, "fail_async_for_b"),
            "ledger.awaited",
            "timed out",
        )
    run = ss.runner(redis_client, redis_prefix, text, database_url=steps_db.url)
    entities = [f"x{kind[0]}{lanes}{name}" for name in "abcdef"]
    events = [ss.step(s, e, event_type=event_type) for e in entities for s in (1, 2, 3)]
    with steps_db.connect(autocommit=True) as conn:
        assert ss.feed(run, conn, events) == []
    run.lanes.close()
    for entity in entities:
        if entity.endswith("b"):
            _, last, _, stopped_at, reason = ss.progress(steps_db, entity)
            assert (last, stopped_at) == (1, 2)
            assert error in reason
            assert ss.applied(steps_db, entity) == [(1, 1)]
            parked = redis_client.zrange(
                run.lot.entity_key(ss.STREAM, entity), 0, -1, withscores=True
            )
            assert [score for _, score in parked] == [2.0, 3.0]
        else:
            assert ss.applied(steps_db, entity) == [(1, 1), (1, 2), (1, 3)]


def test_an_unfinished_async_external_attempt_stops_for_review(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """An async external step whose earlier attempt never finished is not awaited again."""
    text = _async_text(2, external=True)
    run = ss.runner(redis_client, redis_prefix, text, database_url=steps_db.url)
    step_handlers.ASYNC_CALLS.clear()
    with steps_db.connect(autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id) "
            "VALUES ('ledger', 'z', 1, 2, 'z:1:2')"
        )
        events = [
            ss.step(1, "z", event_type="ledger.awaited"),
            ss.step(2, "z", event_type="ledger.awaited"),
        ]
        assert ss.feed(run, conn, events) == []
    run.lanes.close()
    assert [(e, s) for e, s, _, _ in step_handlers.ASYNC_CALLS] == [("z", 1)]
    _, last, _, stopped_at, reason = ss.progress(steps_db, "z")
    assert (last, stopped_at) == (1, 2)
    assert reason.startswith("needs_review")


def _ordinary_slots(schema: PgSchema) -> int:
    """The connections the test server gives sessions without a reserved slot."""
    with schema.connect(autocommit=True) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting::int FROM pg_settings WHERE name IN "
                "('max_connections', 'superuser_reserved_connections', 'reserved_connections')"
            ).fetchall()
        )
    return int(
        settings["max_connections"]
        - settings["superuser_reserved_connections"]
        - settings.get("reserved_connections", 0)
    )


def test_async_lanes_that_could_take_more_connections_than_the_server_gives_stop_start_up(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """The most async def lanes that fit beside the consumer's connection (two each) start;
    one more is refused, naming the route's share, the total and what to change."""
    most = (_ordinary_slots(steps_db) - 1) // 2
    fits = ss.routing(redis_client, redis_prefix, _async_text(most), steps_db.url)
    assert [a.connections() for a in fits.appliers] == [2 * most]
    fits.close()
    with pytest.raises(RoutesError) as refused:
        ss.routing(redis_client, redis_prefix, _async_text(most + 1), steps_db.url)
    [line] = refused.value.problems
    need = 2 * most + 2
    assert line.startswith(f"the routes' lanes hold up to {need} PostgreSQL connections ")
    assert f"({ss.STREAM} {need};" in line
    assert line.endswith("lower lanes or raise max_connections")


def test_routes_whose_lanes_fit_alone_but_not_together_stop_start_up(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Two step routes whose lanes each fit the server, and not both: refused, each named
    with its share; either alone starts."""
    slots = _ordinary_slots(steps_db)
    lanes = min(256, slots // 2 + 1)  # two of these exceed the slots, one fits
    assert lanes + 1 <= slots < 2 * lanes + 1
    ledger = _text(lanes)
    seats = ledger.replace('stream = "ledger"', 'stream = "seats"').replace('"ledger.', '"seats.')
    alone = ss.routing(redis_client, redis_prefix, seats, steps_db.url)
    alone.close()
    with pytest.raises(RoutesError) as refused:
        ss.routing(redis_client, redis_prefix, ledger + seats, steps_db.url)
    [line] = refused.value.problems
    assert f"up to {2 * lanes} PostgreSQL connections (ledger {lanes}, seats {lanes};" in line


def test_an_async_handler_cannot_be_many() -> None:
    """async def with many = true is refused at start-up, naming the handler."""
    text = ss.routes_text(
        extra='[route.handlers."ledger.awaited"]\n'
        'function = "tests.integration.step_handlers:slow_call_async"\nmany = true\n'
    )
    with pytest.raises(RoutesError, match="async def, which takes one event"):
        StepApplier(parse_routes(text)[0])  # type: ignore[arg-type]


def test_a_lane_that_loses_its_connection_fails_the_batch_and_the_retry_applies_once(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """One lane's connection dies mid-step: OperationalError (the loop pauses); again: all once."""
    text = _text(4, function="call_out_or_lose_connection")
    run = ss.runner(redis_client, redis_prefix, text, database_url=steps_db.url)
    entities = [f"c{i}" for i in range(8)]
    events = [ss.step(s, e, event_type="ledger.mailed") for e in entities for s in (1, 2)]
    step_handlers.CUT.clear()
    step_handlers.CUT.add(("c5", 2))
    with steps_db.connect(autocommit=True) as conn:
        with pytest.raises(psycopg.OperationalError):
            ss.feed(run, conn, events)
        assert ss.feed(run, conn, events) == []  # as the consumer does once it resumes
    run.lanes.close()
    for entity in entities:
        assert ss.applied(steps_db, entity) == [(1, 1), (1, 2)]


def _lane_backends(db: PgSchema, since: object) -> int:
    """The route's lane sessions open on the server that started after ``since``."""
    with db.connect(autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND backend_start >= %s",
            (f"inorder-lanes/{ss.STREAM}", since),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _when(count: Callable[[], int], expected: int) -> int:
    """``count()`` once it is ``expected``, or after 10 s whatever it is then."""
    deadline = time.monotonic() + 10
    seen = count()
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = count()
    return seen


# Each route's handlers, and the connections its 4 lanes keep open: the threads' (a plain
# handler beside the awaited one), the event loop's too; the loop's alone when every
# handler is awaited (the turns run on the loop).
KEPT = {
    "plain": ("slow_call", False, 4),
    "async": ("slow_call_async", False, 8),
    "only_async": ("slow_call_async", True, 4),
}


@pytest.mark.parametrize("handlers", list(KEPT))
@pytest.mark.parametrize("kept", [True, False])
def test_kept_lanes_open_their_connections_at_start_up_and_keep_them_through_their_work(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, kept: bool, handlers: str
) -> None:
    """keep_lanes_open: the connections the lanes' turns take are open when start-up ends,
    and still are after a burst; unset, none opens before a lane needs it."""
    function, alone, every = KEPT[handlers]
    with steps_db.connect(autocommit=True) as conn:
        since = conn.execute("SELECT clock_timestamp()").fetchone()
    assert since is not None
    text = _text(4, function=function)
    if alone:
        text = text.replace('"ledger.added" = "tests.integration.step_handlers:record"\n', "")
    if kept:
        text = text.replace("lanes = 4\n", "lanes = 4\nkeep_lanes_open = true\n")
    run = ss.runner(redis_client, redis_prefix, text, database_url=steps_db.url, carry=True)
    count = partial(_lane_backends, steps_db, since[0])
    try:
        if kept:
            assert count() == every  # start-up waited for them
        else:
            time.sleep(0.5)
            assert count() == 0
        entities = [f"k{i}" for i in range(12)]
        events = [ss.step(s, e, event_type="ledger.mailed") for e in entities for s in (1, 2)]
        with steps_db.connect(autocommit=True) as conn:
            assert ss.feed(run, conn, events) == []
        assert ss.settle(run) == []
        for entity in entities:
            assert ss.applied(steps_db, entity) == [(1, 1), (1, 2)]
        assert 1 <= count() <= 8
        if kept:
            assert count() == every  # none closed after a burst
            pool = run.lanes.pool
            assert pool is not None
            assert pool.get_stats()["pool_min"] == (0 if alone else 4)
            apool = run.lanes._apool  # the event loop's, for async def steps
            assert (apool is not None) == function.endswith("_async")
            assert apool is None or apool.get_stats()["pool_min"] == 4
    finally:
        run.close()
    assert _when(count, 0) == 0


@pytest.mark.parametrize("kept", [False, True])
@pytest.mark.parametrize("tasks", [1, 2, 6, 8, 20])
def test_busy_lanes_get_their_connections_opened_together_never_more_than_the_lanes(
    steps_db: PgSchema, tasks: int, kept: bool
) -> None:
    """Tasks submitted at once have their connections opened together, before any asks
    for one; the pool never holds more than the lanes, and keeps no minimum after unless
    the lanes are kept open (then all of them, throughout)."""
    pool = postgres.pool(steps_db.url, "inorder-lanes/widen", 8)
    lanes = Lanes(8, pool)
    if kept:
        assert lanes.keep_open(threads=True, awaited=False, wait_s=10)
    go = threading.Event()
    held: list[int] = []
    try:
        for _ in range(tasks):

            def task() -> None:
                go.wait(10)
                with lanes.connection() as conn:
                    held.append(conn.info.backend_pid)

            lanes.submit(task)
        opening = pool.get_stats()["pool_size"]
        # Before any task asked: all but one of the connections the busy lanes need (the
        # pool's own growth opens that one when asked); kept open, every lane's.
        assert opening == (8 if kept else max(0, min(tasks, 8) - 1))
        go.set()
        pool.wait(10)  # the ones being opened are open
        deadline = time.monotonic() + 10
        while len(held) < tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = pool.get_stats()
        assert len(held) == tasks
        assert stats["pool_size"] <= 8
        assert stats["pool_size"] == 8 or not kept
        assert stats["pool_min"] == (8 if kept else 0)
    finally:
        go.set()
        lanes.close()
