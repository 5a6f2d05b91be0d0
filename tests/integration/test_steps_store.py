"""Step routes against real PostgreSQL and Redis: order, parking, caps, external calls, failures."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from consumer import metrics
from consumer.kinds import Arrivals
from consumer.kinds.steps import gauges as step_gauges
from consumer.kinds.steps.plan import Progress
from producer import migrate
from schemas import encode
from tests.conftest import PgSchema
from tests.integration import step_handlers
from tests.integration import step_support as ss
from tests.support import libpq


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_permutation_with_duplicates_applies_each_step_once_in_order(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, data: st.DataObject
) -> None:
    """30 steps shuffled with duplicates, in batches, one or many per call: 1..30 once, in order."""
    entity = f"e{data.draw(st.integers(0, 10**9))}"
    handler = data.draw(st.sampled_from(["record", "record_many"]))
    events = [ss.step(seq, entity) for seq in range(1, 31)]
    delivered = data.draw(
        st.permutations(events + data.draw(st.lists(st.sampled_from(events), max_size=15)))
    )
    cuts = sorted(data.draw(st.lists(st.integers(1, len(delivered) - 1), max_size=6, unique=True)))
    run = ss.runner(redis_client, redis_prefix, ss.routes_text(handler))
    with steps_db.connect(autocommit=True) as conn:
        for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
            assert ss.feed(run, conn, delivered[start:end]) == []
    assert ss.applied(steps_db, entity) == [(1, s) for s in range(1, 31)]
    assert ss.progress(steps_db, entity)[:2] == (1, 30)
    assert not redis_client.exists(run.lot.entity_key(ss.STREAM, entity))
    assert redis_client.zscore(run.lot.index_key(ss.STREAM, entity), entity) is None


def test_early_event_is_parked_in_redis_until_its_predecessor(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Up to 6 applied; 8 sits in the entity's sorted set and index; 7 arrives and both apply."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(s) for s in range(1, 7)])
        ss.feed(run, conn, [ss.step(8)])
        key = run.lot.entity_key(ss.STREAM, "a")
        assert [score for _, score in redis_client.zrange(key, 0, -1, withscores=True)] == [8.0]
        assert redis_client.zscore(run.lot.index_key(ss.STREAM, "a"), "a") is not None
        assert ss.progress(steps_db)[:2] == (1, 6)
        ss.feed(run, conn, [ss.step(7)])
    assert ss.applied(steps_db) == [(1, s) for s in range(1, 9)]
    assert not redis_client.exists(key)


def test_full_parking_set_holds_the_entity_and_loses_nothing(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """At its cap an entity's next early event is handed back to be held; the entity is marked."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text(max_parked=3))
    with steps_db.connect(autocommit=True) as conn:
        held = ss.feed(run, conn, [ss.step(s) for s in (3, 4, 5, 6)])
    assert [e.seq for e in held] == [6]
    assert ss.progress(steps_db)[2] is True
    assert redis_client.zcard(run.lot.entity_key(ss.STREAM, "a")) == 3


@pytest.mark.parametrize("handler", ["fail_at_13", "fail_at_13_many"])
def test_failing_function_stops_only_its_entity(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, handler: str
) -> None:
    """A function that raises (alone or for many steps) stops its entity at that seq only."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text(handler))
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(s, e) for e in ("a", "b") for s in range(1, 13)])
        ss.feed(run, conn, [ss.step(13, "a"), ss.step(14, "a"), ss.step(15, "a"), ss.step(13, "b")])
    _, last, _, stopped_at, reason = ss.progress(steps_db, "a")
    assert (last, stopped_at) == (12, 13)
    assert "seq 13 is refused" in reason
    assert ss.applied(steps_db, "a") == [(1, s) for s in range(1, 13)]
    assert redis_client.zcard(run.lot.entity_key(ss.STREAM, "a")) == 3
    assert ss.progress(steps_db, "b")[3] is not None  # b hit the same refusal at 13


@pytest.mark.parametrize("failing", [51, 60, 120])
def test_many_failing_functions_in_one_batch_stop_each_entity_and_apply_the_rest(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, failing: int
) -> None:
    """More failing entities in one poll batch than any fixed limit: each stopped, rest applied."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text("fail_unless_ok"))
    bad = [f"bad-{i}" for i in range(failing)]
    good = [f"ok-{i}" for i in range(20)]
    events = [ss.step(s, e) for e in bad + good for s in (1, 2)]
    random.Random(failing).shuffle(events)
    events.sort(key=lambda e: e.seq)  # each entity's steps in order, entities mixed
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, events)
    for entity in bad:
        _, last, _, stopped_at, reason = ss.progress(steps_db, entity)
        assert (last, stopped_at) == (0, 1)
        assert "refused" in reason
    for entity in good:
        assert ss.applied(steps_db, entity) == [(1, 1), (1, 2)]


@pytest.mark.parametrize("threshold", [1, 3, 5])
def test_a_statement_skipped_after_another_step_s_failure_runs_in_the_retry(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, threshold: int
) -> None:
    """A failing step's statement in a pipelined batch makes the server skip the PREPARE
    psycopg sent after it for an earlier entity's second step, and listed as made: the
    batch's retry statement by statement runs that statement from the entity's first
    step, and every other entity applies, in this batch and the next ones, none stopped."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text("fail_sql_unless_ok"))
    # Before the failing entity in every round; psycopg prepares the statement at a use in
    # round 2 (its default threshold is 5).
    good = [f"ok-{i}" for i in range(max(threshold - 1, 1))]
    with steps_db.connect(autocommit=True) as conn:
        conn.prepare_threshold = threshold
        first = [ss.step(seq, entity) for entity in good for seq in (1, 2)]
        ss.feed(run, conn, [*first, ss.step(1, "zz-bad")])
        for seq in range(3, 6):
            ss.feed(run, conn, [ss.step(seq, entity) for entity in good])
    for entity in good:
        assert ss.progress(steps_db, entity)[1:4] == (5, False, None)
        assert ss.applied(steps_db, entity) == [(1, s) for s in range(1, 6)]
    _, last, _, stopped_at, reason = ss.progress(steps_db, "zz-bad")
    assert (last, stopped_at) == (0, 1)
    assert "DivisionByZero" in reason


EXTERNAL = (
    '[route.handlers."ledger.mailed"]\n'
    'function = "tests.integration.step_handlers:call_out"\nexternal = true\n'
)


def test_interrupted_external_call_needs_review_and_is_not_retried(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """An external call recorded as started but never finished stops the entity for a person."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text(extra=EXTERNAL))
    step_handlers.CALLS.clear()
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(1), ss.step(2, event_type="ledger.mailed")])
        assert step_handlers.CALLS == [("a", 2)]
        conn.execute(  # as if the process died during the call for seq 3
            "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id) "
            "VALUES ('ledger', 'a', 1, 3, 'a:1:3')"
        )
        ss.feed(run, conn, [ss.step(3, event_type="ledger.mailed"), ss.step(4)])
    assert step_handlers.CALLS == [("a", 2)]
    _, last, _, stopped_at, reason = ss.progress(steps_db)
    assert (last, stopped_at) == (2, 3)
    assert reason.startswith("needs_review")
    parked = redis_client.zrange(run.lot.entity_key(ss.STREAM, "a"), 0, -1, withscores=True)
    assert [score for _, score in parked] == [3.0, 4.0]  # the stopped step waits as well


def test_interrupted_idempotent_external_call_is_retried(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """A call declared idempotent is simply made again after an interruption."""
    run = ss.runner(
        redis_client, redis_prefix, ss.routes_text(extra=EXTERNAL + "idempotent = true\n")
    )
    step_handlers.CALLS.clear()
    with steps_db.connect(autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id) "
            "VALUES ('ledger', 'a', 1, 1, 'a:1:1')"
        )
        ss.feed(run, conn, [ss.step(1, event_type="ledger.mailed"), ss.step(2)])
    assert step_handlers.CALLS == [("a", 1)]
    assert ss.progress(steps_db)[:2] == (1, 2)


def test_new_generation_starts_over_and_discards_old_parked_events(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Generation 2's seq 1 starts over; parked generation-1 events are dropped as stale."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(1), ss.step(2), ss.step(5)])
        ss.feed(run, conn, [ss.step(1, generation=2), ss.step(2, generation=2)])
        ss.feed(run, conn, [ss.step(3, generation=1)])
    assert ss.applied(steps_db) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert ss.progress(steps_db)[:2] == (2, 2)
    assert not redis_client.exists(run.lot.entity_key(ss.STREAM, "a"))


@pytest.mark.parametrize("handler", ["bad_sql_for_a_at_13", "bad_sql_many_for_a_at_13"])
def test_failing_sql_in_a_function_stops_the_right_entity(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, handler: str
) -> None:
    """A statement that fails inside one entity's step (or a many call) stops that entity only."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text(handler))
    with steps_db.connect(autocommit=True) as conn:
        batch = [ss.step(s, e) for s in range(1, 16) for e in ("a", "b", "c")]
        ss.feed(run, conn, batch)
    assert ss.progress(steps_db, "a")[1:4] == (12, False, 13)
    assert "no_such_table" in ss.progress(steps_db, "a")[4]
    for entity in ("b", "c"):
        assert ss.applied(steps_db, entity) == [(1, s) for s in range(1, 16)]
    assert ss.applied(steps_db, "a") == [(1, s) for s in range(1, 13)]


def test_event_types_without_a_function_still_advance(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """A type the route has no function for takes its place in the order; nothing waits on it."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(1), ss.step(2, event_type="ledger.noted"), ss.step(3)])
    assert ss.applied(steps_db) == [(1, 1), (1, 3)]
    assert ss.progress(steps_db)[:2] == (1, 3)


def test_leftover_of_an_applied_event_is_removed_on_drain(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """A parked copy of a seq already applied (a crash before its removal) is cleared, not rerun."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    key = run.lot.entity_key(ss.STREAM, "a")
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(1), ss.step(2)])
        run.store.mark(conn, {"a": (1, 5)})  # as every park is marked first
        run.lot.park(
            ss.STREAM, [("a", 2, encode(ss.step(2))), ("a", 5, encode(ss.step(5)))], (10, 2**30), 60
        )
        ss.feed(run, conn, [ss.step(3)])
    assert [m for m, _ in redis_client.zrange(key, 0, -1, withscores=True)] == [encode(ss.step(5))]
    assert ss.applied(steps_db) == [(1, 1), (1, 2), (1, 3)]


def test_many_function_is_called_once_for_a_batch(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Three entities' five due steps each reach a many function in one call of 15."""
    step_handlers.MANY_CALLS.clear()
    run = ss.runner(redis_client, redis_prefix, ss.routes_text("counted_many"))
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(s, e) for s in range(5, 0, -1) for e in ("a", "b", "c")])
    assert step_handlers.MANY_CALLS == [15]
    for entity in ("a", "b", "c"):
        assert ss.applied(steps_db, entity) == [(1, s) for s in range(1, 6)]


def test_claim_advances_only_entities_still_where_the_plan_found_them(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Claims from a stale start or on a stopped entity change nothing and are not returned."""
    store = ss.runner(redis_client, redis_prefix, ss.routes_text()).store
    with steps_db.connect() as conn:
        store.lock(conn, {e: ss.step(1, e) for e in ("a", "b", "c")})
        store.claim_many(conn, [(e, Progress(1, 0), Progress(1, 5)) for e in ("a", "b", "c")])
        store.stop(conn, "c", 6, "a person looks first")
        claimed = store.claim_many(
            conn,
            [
                ("a", Progress(1, 5), Progress(1, 7)),
                ("b", Progress(1, 3), Progress(1, 6)),
                ("c", Progress(1, 5), Progress(1, 6)),
            ],
        )
        conn.commit()
    assert claimed == {"a"}
    assert [ss.progress(steps_db, e)[:2] for e in ("a", "b", "c")] == [(1, 7), (1, 5), (1, 5)]


def test_advance_that_would_miss_fails_the_transaction_and_changes_nothing(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """An unanswered claim from a stale start raises, naming the entity; nothing moves."""
    store = ss.runner(redis_client, redis_prefix, ss.routes_text()).store
    with steps_db.connect() as conn:
        store.lock(conn, {e: ss.step(1, e) for e in ("a", "b")})
        store.advance(conn, [(e, Progress(1, 0), Progress(1, 2)) for e in ("a", "b")])
        conn.commit()
        store.lock(conn, {e: ss.step(3, e) for e in ("a", "b")})
        with pytest.raises(psycopg.errors.InvalidTextRepresentation, match="progress of b moved"):
            store.advance(
                conn, [("a", Progress(1, 2), Progress(1, 3)), ("b", Progress(1, 1), Progress(1, 3))]
            )
        conn.rollback()
    assert [ss.progress(steps_db, e)[:2] for e in ("a", "b")] == [(1, 2), (1, 2)]


@pytest.mark.parametrize(
    ("known", "analyzed", "warmed"),
    [(20_000, True, False), (10_000, False, False), (10_000, False, True)],
)
def test_locking_and_claiming_read_only_the_batch_progress_rows(
    steps_db: PgSchema,
    redis_client: redis.Redis,
    redis_prefix: str,
    known: int,
    analyzed: bool,
    warmed: bool,
) -> None:
    """10,000s of entities, analyzed or not, plans cached while few: a batch reads only its rows."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    with steps_db.connect(autocommit=True) as conn:
        # Prepared (after 5 runs) and given a generic plan (after 5 more) while the table is tiny.
        for n in range(12 if warmed else 0):
            with conn.transaction():
                few = {f"w{n}.{k}": ss.step(1, f"w{n}.{k}") for k in range(3)}
                progress = run.store.lock(conn, few)
                run.store.claim_many(conn, [(e, progress[e], Progress(1, 1)) for e in few])
                run.store.mark_parked(conn, [ss.step(3, e) for e in few])
                run.store.read(conn, list(few))
        conn.execute(
            "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied) "
            "SELECT %s, 'e' || g, 1, 1 FROM generate_series(1, %s) AS g",
            (ss.STREAM, known),
        )
        if analyzed:
            conn.execute("ANALYZE inorder_step_progress")
        # Counts of earlier transactions not yet sent to the statistics would show below.
        conn.execute("SELECT pg_stat_force_next_flush()")
        firsts = {f"e{n}": ss.step(2, f"e{n}") for n in range(7, 4000, 200)}
        with conn.transaction():
            progress = run.store.lock(conn, firsts)
            claims = [(e, progress[e], Progress(1, 2)) for e in firsts]
            assert run.store.claim_many(conn, claims) == set(firsts)
            run.store.mark_parked(conn, [ss.step(4, e) for e in firsts])
            assert run.store.read(conn, list(firsts)).keys() == firsts.keys()
            row = conn.execute(
                "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables "
                "WHERE relid = 'inorder_step_progress'::regclass"
            ).fetchone()
    assert row is not None
    # Each row is looked up six times: created if missing, locked, checked, advanced, marked,
    # read (as the sweeper reads it).
    assert row[0] <= 6 * len(firsts)


def test_review_gauge_moves_at_the_next_poll_after_a_stop(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """An entity stopped by a failing step shows in steps_needs_review at the next refresh."""
    gauges = metrics.Gauges(tables=[step_gauges.refresh])
    run = ss.runner(redis_client, redis_prefix, ss.routes_text("fail_at_13"))
    with steps_db.connect(autocommit=True) as conn:
        gauges.refresh(conn)
        assert REGISTRY.get_sample_value("steps_needs_review") == 0
        ss.feed(run, conn, [ss.step(s) for s in range(1, 14)])
        gauges.refresh(conn)
    assert REGISTRY.get_sample_value("steps_needs_review") == 1


@pytest.mark.parametrize("extra", ["", EXTERNAL])
def test_every_park_is_marked_in_postgres_before_it_goes_to_redis(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, extra: str
) -> None:
    """The newest parked version is on the progress row, whether the batch had external calls."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text(extra=extra))
    mailed = ss.step(2, event_type="ledger.mailed") if extra else ss.step(2)
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(1), mailed, ss.step(5), ss.step(4)])
        marks = conn.execute(
            "SELECT last_applied, parked_generation, parked_through FROM inorder_step_progress "
            "WHERE entity_id = 'a'"
        ).fetchone()
    assert marks == (2, 1, 5)
    assert redis_client.zcard(run.lot.entity_key(ss.STREAM, "a")) == 2


def _zmscore_calls(client: redis.Redis) -> int:
    """ZMSCORE calls Redis has served, over every primary of a cluster."""
    if isinstance(client, redis.RedisCluster):
        nodes: Any = client.info("commandstats", target_nodes=redis.RedisCluster.PRIMARIES)
        found = list(nodes.values())
    else:
        found = [client.info("commandstats")]
    return sum(int(stats.get("cmdstat_zmscore", {}).get("calls", 0)) for stats in found)


def test_in_order_batches_ask_redis_nothing_until_something_parks(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Steps in order never look for parked successors; once 5 parks, 4 looks and drains it."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    with steps_db.connect(autocommit=True) as conn:
        before = _zmscore_calls(redis_client)
        for seq in (1, 2, 3):
            ss.feed(run, conn, [ss.step(seq, e) for e in ("a", "b", "c")])
        assert _zmscore_calls(redis_client) == before
        ss.feed(run, conn, [ss.step(5)])
        ss.feed(run, conn, [ss.step(4)])
    assert ss.applied(steps_db) == [(1, s) for s in range(1, 6)]
    assert not redis_client.exists(run.lot.entity_key(ss.STREAM, "a"))


def test_parks_of_a_release_without_marks_are_marked_and_drained(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Seq 3 parked with no mark (an earlier release): a restarted route marks it; 2 drains it."""
    old = ss.runner(redis_client, redis_prefix, ss.routes_text())
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(old, conn, [ss.step(1)])
        redis_client.delete(old.lot.marks_key(ss.STREAM))  # as before the marks existed
        old.lot.park(ss.STREAM, [("a", 3, encode(ss.step(3)))], (10, 2**30), 60)
        restarted = ss.runner(redis_client, redis_prefix, ss.routes_text())
        ss.feed(restarted, conn, [ss.step(2)])
    assert ss.applied(steps_db) == [(1, 1), (1, 2), (1, 3)]
    assert redis_client.exists(old.lot.marks_key(ss.STREAM))


def test_batch_statements_are_planned_once_not_at_every_batch(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """After 15 batches every prepared step statement runs a generic plan (5 custom at most)."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    with steps_db.connect(autocommit=True) as conn:
        for n in range(15):
            ss.feed(run, conn, [ss.step(1, f"p{n}.{k}") for k in range(n % 4 + 1)])
            ss.feed(run, conn, [ss.step(3, f"p{n}.0")])  # parks: the mark statement too
        plans = conn.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%%inorder_step_%%'"
        ).fetchall()
    assert len(plans) >= 4
    assert [(s[:60], c) for s, _, c in plans if c > 5] == []


def test_a_batch_in_order_is_one_pipeline_with_begin_and_commit_inside(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, tmp_path: Any
) -> None:
    """An in-order batch syncs twice (locks, then COMMIT): BEGIN and COMMIT ride with the rest."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(1, e) for e in ("a", "b")])  # the route's first batch
        lines, _ = libpq.traced(
            conn, tmp_path / "trace", lambda: ss.feed(run, conn, [ss.step(2, e) for e in "ab"])
        )
    queries = [line for line in lines if line.startswith("F") and "Parse" in line]
    assert libpq.sent(lines).count("Sync") == 2
    assert "BEGIN" in queries[0]
    assert "COMMIT" in queries[-1]
    assert ss.applied(steps_db, "b") == [(1, 1), (1, 2)]


def test_a_handler_may_write_follow_up_events_to_the_outbox(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """A handler that emits, in batches with duplicates: each step applied and emitted once."""
    with steps_db.connect(autocommit=True) as conn:
        migrate.apply(conn)
        run = ss.runner(redis_client, redis_prefix, ss.routes_text("record_and_emit"))
        for batch in ([1, 2], [2, 3, 4], [4, 5]):
            ss.feed(run, conn, [ss.step(seq) for seq in batch])
        emitted = conn.execute(
            "SELECT seq FROM outbox WHERE entity_type = 'seat_ledger' ORDER BY seq"
        ).fetchall()
        stopped = conn.execute("SELECT stop_reason FROM inorder_step_progress").fetchall()
    assert stopped == [(None,)]
    assert ss.applied(steps_db) == [(1, s) for s in range(1, 6)]
    assert [row[0] for row in emitted] == [1, 2, 3, 4, 5]


def test_a_handler_savepoint_after_a_read_stays_inside_the_step_transaction(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """A function's own transaction() after a read is a savepoint of the step's transaction."""
    step_handlers.TRANSACTIONS.clear()
    run = ss.runner(redis_client, redis_prefix, ss.routes_text("read_then_savepoint"))
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(1), ss.step(2)])
        logged = conn.execute("SELECT DISTINCT xmin::text FROM inorder_step_log").fetchall()
    assert ss.applied(steps_db) == [(1, 1), (1, 2)]
    assert set(step_handlers.TRANSACTIONS) == {row[0] for row in logged}
    assert len(logged) == 1


def test_a_repeated_event_beside_an_external_step_loses_nothing(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """1..5 with 5 external and 2 delivered twice in one batch: 1..5 applied, nothing parked."""
    run = ss.runner(
        redis_client, redis_prefix, ss.routes_text(extra=EXTERNAL + "idempotent = true\n")
    )
    events = [
        ss.step(s, "dup", event_type="ledger.mailed" if s == 5 else "ledger.added")
        for s in range(1, 6)
    ]
    with steps_db.connect(autocommit=True) as conn:
        assert ss.feed(run, conn, [*events, ss.step(2, "dup")]) == []
    assert ss.applied(steps_db, "dup") == [(1, s) for s in range(1, 6)]
    assert not redis_client.exists(run.lot.entity_key(ss.STREAM, "dup"))


def test_a_snapshot_is_ignored_by_a_step_route_without_baseline(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Without baseline a snapshot changes nothing: counted stale, nothing applied or parked."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    snapshot = ss.step(9, event_type="ledger.snapshot")
    with steps_db.connect(autocommit=True) as conn:
        assert ss.feed(run, conn, [ss.step(1), snapshot, ss.step(2)]) == []
        outcome = run.apply(conn, [snapshot], Arrivals([(snapshot, encode(snapshot))]))
    assert [e.seq for e in outcome.stale] == [9]
    assert ss.applied(steps_db) == [(1, 1), (1, 2)]
    assert ss.progress(steps_db)[:2] == (1, 2)
    assert not redis_client.exists(run.lot.entity_key(ss.STREAM, "a"))
