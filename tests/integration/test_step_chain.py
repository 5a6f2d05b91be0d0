"""An entity's steps in a lane, each closing carrying the next opening, on real PostgreSQL.

``apply_alone`` on a lane's connection (idle, autocommit) sends the step due next with
the script that logs and commits a step; a run of ``async def`` steps does the same on
one async connection of the lanes' event loop. What another session sees between two
calls must be what it saw when each opening went alone, and a failure on either side of
the commit must cost nothing that was committed. Each test runs both kinds of function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from consumer.kinds.steps import made, script
from consumer.kinds.steps.apply import apply_alone
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.lanes import Lanes
from consumer.kinds.steps.route import Handler
from consumer.kinds.steps.store import StepStore
from schemas import Event
from tests.conftest import PgSchema
from tests.integration import step_handlers
from tests.integration import step_support as ss


def _handlers(function: Callable[..., Any], *, idempotent: bool = True) -> Handlers:
    handler = Handler("tests:function", external=True, idempotent=idempotent)
    return Handlers({"ledger.added": (handler, function)})


Before = Callable[[Event], None]


def _function(kind: str, before: Before | None = None) -> Callable[..., Any]:
    """A step function of ``kind`` (called, or awaited: ``async def``) that runs ``before``
    (which may raise), then records the step on its connection."""
    if kind == "called":

        def call(conn: Any, event: Event) -> None:
            if before is not None:
                before(event)
            step_handlers.record(conn, event)

        return call

    async def awaited(aconn: Any, event: Event) -> None:
        if before is not None:
            before(event)
        await step_handlers.record_async(aconn, event)

    return awaited


@pytest.fixture(params=["called", "awaited"])
def kind(request: pytest.FixtureRequest) -> str:
    """A step function called on the lane's connection, or awaited on the lanes' loop."""
    return str(request.param)


@pytest.fixture
def lanes(pg_schema: PgSchema) -> Iterator[Lanes]:
    """One lane, whose awaited steps connect to the test's schema."""
    one = Lanes(1, dsn=pg_schema.url)
    yield one
    one.close()


@pytest.fixture
def handed(lanes: Lanes, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lanes' hand-overs to their event loop, one 1 each."""
    seen: list[int] = []
    awaiting = lanes.awaiting

    def handed_over(work: Any) -> Any:
        seen.append(1)
        return awaiting(work)

    monkeypatch.setattr(lanes, "awaiting", handed_over)
    return seen


def _seen(schema: PgSchema, entity: str = "a") -> tuple[Any, ...]:
    """What another session sees of ``entity``: its attempts (seq, finished), its progress,
    its logged steps."""
    with schema.connect(autocommit=True) as other:
        attempts = other.execute(
            "SELECT seq, completed_at IS NOT NULL FROM inorder_step_attempts "
            "WHERE entity_id = %s ORDER BY seq",
            (entity,),
        ).fetchall()
        last = other.execute(
            "SELECT last_applied FROM inorder_step_progress WHERE entity_id = %s", (entity,)
        ).fetchone()
        logged = other.execute(
            "SELECT seq FROM inorder_step_log WHERE entity_id = %s ORDER BY seq", (entity,)
        ).fetchall()
    return (attempts, None if last is None else last[0], [s for (s,) in logged])


def _fail_once(schema: PgSchema, table: str, seq: int) -> None:
    """The first row with ``seq`` written to ``table`` fails (a sequence counts: it is not
    rolled back with the failing statement)."""
    with schema.connect(autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE failures")
        conn.execute(
            "CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.seq = {seq} AND nextval('failures') = 1 THEN "
            "RAISE EXCEPTION 'planted failure'; END IF; RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER fail_once BEFORE INSERT ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION fail_once()"
        )


def test_between_two_calls_the_step_before_is_committed_and_the_next_attempt_too(
    pg_schema: PgSchema,
    step_store: StepStore,
    lane: psycopg.Connection[Any],
    lanes: Lanes,
    kind: str,
    handed: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """During each call the steps before it are logged and its own attempt is committed;
    awaited steps go to the loop once for the whole run."""
    during: list[tuple[Any, ...]] = []
    scripts: list[list[Any]] = []  # every script the lane sent, its parts
    sent: list[list[Any]] = []  # the script the lane sent last before each call
    answers, answers_async = script.answers, script.answers_async

    def spied(conn: Any, parts: Any) -> Any:
        scripts.append(list(parts))
        return answers(conn, parts)

    async def spied_async(aconn: Any, parts: Any) -> Any:
        scripts.append(list(parts))
        return await answers_async(aconn, parts)

    def seen(event: Event) -> None:
        during.append(_seen(pg_schema))
        sent.append(scripts[-1])

    monkeypatch.setattr(script, "answers", spied)
    monkeypatch.setattr(script, "answers_async", spied_async)
    events = [ss.step(s) for s in (1, 2, 3)]
    handlers = _handlers(_function(kind, seen))
    done = apply_alone(lane, step_store, handlers, lanes, "a", events)
    assert [e.seq for e in done.apply] == [1, 2, 3]
    # Step 1 was opened by the script that read the entity's progress (awaited, both on
    # the loop's connection, in the one hand-over); steps 2 and 3 by the script that
    # logged and committed the step before. (The commits are the attempts' and, once
    # chained, the step's before.)
    read = scripts[0]
    assert read[0][0].startswith("WITH ins AS (INSERT INTO inorder_step_progress")
    assert len(scripts) == 4  # the read with the opening, two closings chained, the last
    assert handed == ([] if kind == "called" else [1])
    assert sent[0].count("COMMIT") == 1
    for parts in sent[1:]:
        assert parts.count("COMMIT") == 2
    for parts in sent:
        assert parts[-1][0].startswith("UPDATE inorder_step_progress")  # the claim
    assert during == [
        ([(1, False)], 0, []),
        ([(1, True), (2, False)], 1, [1]),
        ([(1, True), (2, True), (3, False)], 2, [1, 2]),
    ]
    assert _seen(pg_schema) == ([(1, True), (2, True), (3, True)], 3, [1, 2, 3])
    assert ss.applied(pg_schema) == [(1, 1), (1, 2), (1, 3)]
    assert lane.info.transaction_status == TransactionStatus.IDLE


def test_a_guessed_opening_that_does_not_stand_is_rolled_back_and_the_due_step_opens_itself(
    pg_schema: PgSchema,
    step_store: StepStore,
    lane: psycopg.Connection[Any],
    lanes: Lanes,
    kind: str,
    handed: list[int],
) -> None:
    """Step 1 came again after it applied: the read's opening for it, guessed, writes
    nothing; 2 and 3 apply once, each once called (awaited: a second hand-over)."""
    calls: list[int] = []
    handlers = _handlers(_function(kind, lambda event: calls.append(event.seq)), idempotent=False)
    apply_alone(lane, step_store, handlers, lanes, "a", [ss.step(1)])
    assert calls == [1]
    done = apply_alone(lane, step_store, handlers, lanes, "a", [ss.step(s) for s in (1, 2, 3)])
    assert [e.seq for e in done.stale] == [1]
    assert [e.seq for e in done.apply] == [2, 3]
    assert done.stopped is None
    assert calls == [1, 2, 3]
    assert handed == ([] if kind == "called" else [1, 1, 1])
    assert _seen(pg_schema) == ([(1, True), (2, True), (3, True)], 3, [1, 2, 3])
    assert lane.info.transaction_status == TransactionStatus.IDLE


def test_an_awaited_entity_the_loop_finds_no_row_of_is_read_by_its_lane(
    pg_schema: PgSchema,
    step_store: StepStore,
    lane: psycopg.Connection[Any],
    lanes: Lanes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No progress row in the loop's snapshot: the lane reads the entity (under a lock,
    should it need one) and hands the run over from there; every step applies once."""

    async def no_row(*args: Any) -> None:
        return None

    monkeypatch.setattr(made, "read_async", no_row)
    calls: list[int] = []
    handlers = _handlers(_function("awaited", lambda event: calls.append(event.seq)))
    done = apply_alone(lane, step_store, handlers, lanes, "a", [ss.step(s) for s in (1, 2)])
    assert [e.seq for e in done.apply] == [1, 2]
    assert calls == [1, 2]
    assert _seen(pg_schema) == ([(1, True), (2, True)], 2, [1, 2])
    assert lane.info.transaction_status == TransactionStatus.IDLE


def test_a_next_opening_that_fails_leaves_the_step_before_and_is_sent_again(
    pg_schema: PgSchema,
    step_store: StepStore,
    lane: psycopg.Connection[Any],
    lanes: Lanes,
    kind: str,
) -> None:
    """Step 2's attempt fails once inside step 1's closing: 1 stands, 2 opens again, all apply."""
    _fail_once(pg_schema, "inorder_step_attempts", 2)
    calls: list[int] = []
    handlers = _handlers(_function(kind, lambda event: calls.append(event.seq)), idempotent=False)
    events = [ss.step(s) for s in (1, 2, 3)]
    done = apply_alone(lane, step_store, handlers, lanes, "a", events)
    assert [e.seq for e in done.apply] == [1, 2, 3]
    assert done.stopped is None
    assert calls == [1, 2, 3]
    assert _seen(pg_schema) == ([(1, True), (2, True), (3, True)], 3, [1, 2, 3])
    assert lane.info.transaction_status == TransactionStatus.IDLE


def test_a_closing_that_fails_commits_neither_its_step_nor_the_next_opening(
    pg_schema: PgSchema,
    step_store: StepStore,
    lane: psycopg.Connection[Any],
    lanes: Lanes,
    kind: str,
) -> None:
    """Step 1's log fails: 1 is not applied, 2 neither attempted nor claimed; later both apply."""
    _fail_once(pg_schema, "inorder_step_log", 1)
    events = [ss.step(s) for s in (1, 2)]
    handlers = _handlers(_function(kind))
    with pytest.raises(psycopg.errors.RaiseException, match="planted failure"):
        apply_alone(lane, step_store, handlers, lanes, "a", events)
    assert _seen(pg_schema) == ([(1, False)], 0, [])
    assert ss.applied(pg_schema) == []
    assert lane.info.transaction_status == TransactionStatus.IDLE
    done = apply_alone(lane, step_store, handlers, lanes, "a", events)
    assert [e.seq for e in done.apply] == [1, 2]
    assert ss.applied(pg_schema) == [(1, 1), (1, 2)]


def test_a_step_that_raises_after_a_carried_opening_rolls_back_its_claim(
    pg_schema: PgSchema,
    step_store: StepStore,
    lane: psycopg.Connection[Any],
    lanes: Lanes,
    kind: str,
) -> None:
    """Step 2 opened by step 1's closing raises: 1 stands, 2's claim is undone, 3 waits."""

    def refuse_2(event: Event) -> None:
        if event.seq == 2:
            raise TimeoutError("the API did not answer")

    events = [ss.step(s) for s in (1, 2, 3)]
    done = apply_alone(lane, step_store, _handlers(_function(kind, refuse_2)), lanes, "a", events)
    assert [e.seq for e in done.apply] == [1]
    assert [e.seq for e in done.park] == [2, 3]
    assert [f.event.seq for f in done.failed] == [2]
    assert _seen(pg_schema) == ([(1, True), (2, False)], 1, [1])
    assert ss.applied(pg_schema) == [(1, 1)]
    assert lane.info.transaction_status == TransactionStatus.IDLE


@pytest.mark.parametrize(
    "function_sends",
    [
        ["DEALLOCATE ALL"],
        # psycopg, having prepared the function's statement, clears its cache on a ROLLBACK
        ["SAVEPOINT mine", "ROLLBACK TO SAVEPOINT mine"],
    ],
)
def test_statements_deallocated_inside_a_step_cost_it_nothing(
    pg_schema: PgSchema,
    step_store: StepStore,
    lane: psycopg.Connection[Any],
    function_sends: list[str],
) -> None:
    """Step 2's function deallocates the lane's statements: its closing goes back to its
    savepoint, prepares them again and commits the step, called once."""
    lane.prepare_threshold = 0  # psycopg prepares the function's own statement at once
    tries: list[int] = []

    def call(conn: Any, event: Event) -> None:
        tries.append(event.seq)
        step_handlers.record(conn, event)
        if event.seq == 2:
            for statement in function_sends:
                conn.execute(statement)
            conn.execute("SELECT 1")  # psycopg's next statement, after which it deallocates

    events = [ss.step(s) for s in (1, 2, 3)]
    done = apply_alone(lane, step_store, _handlers(call), Lanes(1), "a", events)
    assert [e.seq for e in done.apply] == [1, 2, 3]
    assert tries == [1, 2, 3]
    assert _seen(pg_schema) == ([(1, True), (2, True), (3, True)], 3, [1, 2, 3])
    assert ss.applied(pg_schema) == [(1, 1), (1, 2), (1, 3)]
    assert lane.info.transaction_status == TransactionStatus.IDLE
