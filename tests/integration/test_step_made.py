"""A lane's read of an entity sent with the guessed opening of its first step, on real PostgreSQL.

``apply_alone`` on a lane's connection reads the entity's progress in the script that
opens the step one past where it guesses the entity stands. A right guess saves a round
trip; a wrong one must write nothing: no claim, and no attempt recorded for a step that
is not due (found later, it would read as a call cut short and stop the entity).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer.kinds.steps import script
from consumer.kinds.steps.apply import apply_alone
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.lanes import Lanes
from consumer.kinds.steps.route import Handler
from consumer.kinds.steps.store import StepStore
from schemas import Event
from tests.conftest import PgSchema
from tests.integration import step_handlers
from tests.integration import step_support as ss


def _once(calls: list[tuple[str, int, int]]) -> Callable[[Any, Event], None]:
    """An external call that must not be made twice: noted, then the step recorded."""

    def call(conn: Any, event: Event) -> None:
        calls.append((event.entity_id, event.generation, event.seq))
        step_handlers.record(conn, event)

    return call


def _handlers(function: Callable[..., Any]) -> Handlers:
    handler = Handler("tests:once", external=True, idempotent=False)
    return Handlers({"ledger.added": (handler, function)})


def _attempts(schema: PgSchema, entity: str) -> list[tuple[int, int, bool]]:
    """(generation, seq, finished) of every attempt recorded for ``entity``."""
    with schema.connect(autocommit=True) as conn:
        rows = conn.execute(
            "SELECT generation, seq, completed_at IS NOT NULL FROM inorder_step_attempts "
            "WHERE entity_id = %s ORDER BY generation, seq",
            (entity,),
        ).fetchall()
    return [(int(g), int(s), bool(f)) for g, s, f in rows]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """Every script a lane sends from now on, its parts."""
    scripts: list[list[Any]] = []
    answers = script.answers

    def spied(conn: Any, parts: Any) -> Any:
        scripts.append(list(parts))
        return answers(conn, parts)

    monkeypatch.setattr(script, "answers", spied)
    return scripts


def test_a_step_arriving_alone_takes_one_script_before_its_call_and_one_after(
    pg_schema: PgSchema,
    step_store: StepStore,
    lane: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Steps given one at a time: the read carries each one's opening, so two scripts a step."""
    calls: list[tuple[str, int, int]] = []
    scripts = _spy(monkeypatch)
    for seq in (1, 2, 3):
        done = apply_alone(lane, step_store, _handlers(_once(calls)), Lanes(1), "a", [ss.step(seq)])
        assert [e.seq for e in done.apply] == [seq]
    assert len(scripts) == 6
    assert calls == [("a", 1, 1), ("a", 1, 2), ("a", 1, 3)]
    assert ss.applied(pg_schema) == [(1, 1), (1, 2), (1, 3)]
    assert _attempts(pg_schema, "a") == [(1, 1, True), (1, 2, True), (1, 3, True)]


@pytest.mark.parametrize(
    ("stands", "given", "applies"),
    [
        ((1, 2), [5], []),  # early: parks
        ((1, 2), [2], []),  # stale
        ((1, 2), [1, 2], []),  # stale, both
        ((1, 2), [5, 3], [3]),  # one due behind an early one
        ((1, 2), [3, 3], [3]),  # the due one twice
        ((1, 2), [(2, 1)], [(2, 1)]),  # a newer generation starts over at 1
        ((2, 3), [(1, 4)], []),  # an older generation: stale
        ((1, 0), [(1, 2), (1, 1)], [1, 2]),  # made at 0, given out of order
    ],
)
def test_a_wrong_guess_writes_nothing_and_the_due_steps_still_apply(
    pg_schema: PgSchema,
    step_store: StepStore,
    lane: psycopg.Connection[Any],
    stands: tuple[int, int],
    given: list[Any],
    applies: list[Any],
) -> None:
    """Whatever the events given, only the due steps are called and attempted, once."""
    generation, last = stands
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied) "
            "VALUES (%s, 'a', %s, %s)",
            (ss.STREAM, generation, last),
        )
    versions = [v if isinstance(v, tuple) else (generation, v) for v in given]
    due = [v if isinstance(v, tuple) else (generation, v) for v in applies]
    calls: list[tuple[str, int, int]] = []
    events = [ss.step(s, generation=g) for g, s in versions]
    done = apply_alone(lane, step_store, _handlers(_once(calls)), Lanes(1), "a", events)
    assert [e.version for e in done.apply] == due
    assert calls == [("a", g, s) for g, s in due]
    assert _attempts(pg_schema, "a") == [(g, s, True) for g, s in due]
    assert ss.progress(pg_schema)[:2] == (due[-1] if due else stands)
    assert lane.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_an_entity_stopped_for_a_person_records_no_attempt_for_its_stopped_step(
    pg_schema: PgSchema, step_store: StepStore, lane: psycopg.Connection[Any]
) -> None:
    """An entity stopped before seq 3: given seq 3, nothing is attempted, claimed or called."""
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied, "
            "stopped_at_seq, stop_reason, stopped_at) VALUES (%s, 'a', 1, 2, 3, 'review', now())",
            (ss.STREAM,),
        )
    calls: list[tuple[str, int, int]] = []
    done = apply_alone(lane, step_store, _handlers(_once(calls)), Lanes(1), "a", [ss.step(3)])
    assert done.apply == []
    assert [e.seq for e in done.park] == [3]
    assert calls == []
    assert _attempts(pg_schema, "a") == []
    assert ss.progress(pg_schema)[:4] == (1, 2, False, 3)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_order_of_arrival_with_duplicates_calls_each_step_once_in_order(
    pg_schema: PgSchema, step_store: StepStore, lane: psycopg.Connection[Any], data: st.DataObject
) -> None:
    """Steps 1-6 of an entity given in any order, repeated, in any chunks, parked ones given
    again with the next chunk: every call made once, in order, none stopped for review."""
    entity = f"m{uuid.uuid4().hex[:8]}"  # each example its own entity (the schema is shared)
    events = [ss.step(s, entity) for s in range(1, 7)]
    delivered = data.draw(
        st.permutations(events + data.draw(st.lists(st.sampled_from(events), max_size=6)))
    )
    cuts = sorted(data.draw(st.lists(st.integers(1, len(delivered) - 1), max_size=5, unique=True)))
    calls: list[tuple[str, int, int]] = []
    handlers = _handlers(_once(calls))
    parked: list[Event] = []
    for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
        done = apply_alone(
            lane, step_store, handlers, Lanes(1), entity, parked + delivered[start:end]
        )
        assert done.stopped is None
        parked = done.park
    assert parked == []
    assert calls == [(entity, 1, s) for s in range(1, 7)]
    assert ss.applied(pg_schema, entity) == [(1, s) for s in range(1, 7)]
    assert _attempts(pg_schema, entity) == [(1, s, True) for s in range(1, 7)]


def test_a_function_rolling_back_its_own_savepoint_costs_the_lane_nothing(
    pg_schema: PgSchema, step_store: StepStore, lane: psycopg.Connection[Any]
) -> None:
    """A function that catches a failure in a savepoint of its own, once psycopg has prepared
    statements of its own on the lane: every step applies, each call made once."""
    calls: list[tuple[str, int, int]] = []

    def call(conn: Any, event: Event) -> None:
        calls.append((event.entity_id, event.generation, event.seq))
        step_handlers.record(conn, event)  # prepared by psycopg from its fifth time
        if event.seq in (7, 9):
            try:
                with conn.transaction():
                    conn.execute("SELECT 1 / 0")
            except psycopg.errors.DivisionByZero:
                pass  # a failure the function expects, rolled back to its savepoint
        conn.execute("SELECT 1")

    events = [ss.step(s) for s in range(1, 11)]
    for event in events:  # one at a time, each read with its opening
        apply_alone(lane, step_store, _handlers(call), Lanes(1), "a", [event])
    assert ss.progress(pg_schema)[:4] == (1, 10, False, None)
    assert calls == [("a", 1, s) for s in range(1, 11)]
    assert ss.applied(pg_schema) == [(1, s) for s in range(1, 11)]


def _commit_setting(schema: PgSchema) -> None:
    """Each attempt row records the ``synchronous_commit`` its transaction ran with."""
    with schema.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE attempt_commits (seq bigint, setting text)")
        conn.execute(
            "CREATE FUNCTION note_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO attempt_commits VALUES (NEW.seq, current_setting('synchronous_commit'));"
            " RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER note_commit AFTER INSERT ON inorder_step_attempts "
            "FOR EACH ROW EXECUTE FUNCTION note_commit()"
        )


@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("idempotent", [False, True])
def test_only_a_call_that_is_not_idempotent_waits_for_its_attempt_to_reach_the_disk(
    pg_schema: PgSchema,
    step_store: StepStore,
    lane: psycopg.Connection[Any],
    together: bool,
    idempotent: bool,
) -> None:
    """Steps given one at a time (each opened with the read) or all at once (each opened
    with the closing before): an idempotent call's attempt commits with
    ``synchronous_commit`` off, one that is not with the server's setting; each recorded."""
    _commit_setting(pg_schema)
    handler = Handler("tests:once", external=True, idempotent=idempotent)
    handlers = Handlers({"ledger.added": (handler, step_handlers.record)})
    events = [ss.step(seq) for seq in range(1, 6)]
    for batch in [events] if together else [[e] for e in events]:
        apply_alone(lane, step_store, handlers, Lanes(1), "a", batch)
    assert _attempts(pg_schema, "a") == [(1, s, True) for s in range(1, 6)]
    with pg_schema.connect(autocommit=True) as conn:
        noted = conn.execute("SELECT seq, setting FROM attempt_commits ORDER BY seq").fetchall()
    assert noted == [(s, "on" if not idempotent else "off") for s in range(1, 6)]


def test_a_row_made_by_another_session_meanwhile_is_read_under_the_guessed_step_s_lock(
    pg_schema: PgSchema, step_store: StepStore, lane: psycopg.Connection[Any]
) -> None:
    """Another session makes the entity's row while the read waits for it: the read finds
    none, the guessed opening finds it; the step applies once, its park mark read."""
    calls: list[tuple[str, int, int]] = []
    with pg_schema.connect() as other:  # a transaction making the row, not yet committed
        other.execute(
            "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied, "
            "parked_generation, parked_through) VALUES (%s, 'a', 1, 0, 1, 3)",
            (ss.STREAM,),
        )
        done: list[Any] = []
        applying = threading.Thread(
            target=lambda: done.append(
                apply_alone(lane, step_store, _handlers(_once(calls)), Lanes(1), "a", [ss.step(1)])
            )
        )
        applying.start()
        with pg_schema.connect(autocommit=True) as watch:  # the read waits on the row
            for _ in range(500):
                waiting = watch.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                    (lane.info.backend_pid,),
                ).fetchone()
                if waiting and waiting[0] == "Lock":
                    break
                time.sleep(0.01)
            else:
                pytest.fail("the lane's read never waited for the other session's row")
        other.commit()
        applying.join(10)
    [plan] = done
    assert [e.seq for e in plan.apply] == [1]
    assert plan.start is not None
    assert plan.start.parked == (1, 3)  # read under the lock, in the step's transaction
    assert calls == [("a", 1, 1)]
    assert ss.applied(pg_schema) == [(1, 1)]
    assert ss.progress(pg_schema)[:2] == (1, 1)
