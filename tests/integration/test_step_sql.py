"""Step handlers given as SQL, against real PostgreSQL and Redis: once each, in order."""

from __future__ import annotations

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer.errors import RoutesError
from tests.conftest import PgSchema
from tests.integration import step_handlers
from tests.integration import step_support as ss

# The benchmark's row a step, written by a statement; the seq read from the payload, so
# a parameter of each kind is used.
RECORD = (
    "INSERT INTO applied_steps (entity_id, generation, seq, event_type) VALUES "
    "(%(entity_id)s, %(generation)s, (%(payload)s ->> 'amount')::bigint, %(event_type)s)"
)
# Fails at seq 13 (division by zero), writes the row otherwise.
FAIL_AT_13 = RECORD.replace(
    "(%(payload)s ->> 'amount')::bigint", "%(seq)s / (13 - %(seq)s) * 0 + %(seq)s"
)


def _routes(sql: str, *, lanes: int = 1, extra: str = "") -> str:
    return (
        f'[[route]]\nstream = "{ss.STREAM}"\nkind = "step"\nlanes = {lanes}\n'
        f"[route.handlers.\"ledger.added\"]\nsql = '''{sql}'''\n{extra}"
    )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_permutation_with_duplicates_runs_each_step_s_statement_once_in_order(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, data: st.DataObject
) -> None:
    """3 entities x 20 steps shuffled with duplicates, in batches: each statement once, in order."""
    tag = data.draw(st.integers(0, 10**9))
    entities = [f"s{tag}-{i}" for i in range(3)]
    events = [ss.step(seq, e) for e in entities for seq in range(1, 21)]
    delivered = data.draw(
        st.permutations(events + data.draw(st.lists(st.sampled_from(events), max_size=15)))
    )
    cuts = sorted(data.draw(st.lists(st.integers(1, len(delivered) - 1), max_size=6, unique=True)))
    run = ss.runner(redis_client, redis_prefix, _routes(RECORD))
    with steps_db.connect(autocommit=True) as conn:
        for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
            assert ss.feed(run, conn, delivered[start:end]) == []
    for entity in entities:
        assert ss.applied(steps_db, entity) == [(1, s) for s in range(1, 21)]
        assert ss.progress(steps_db, entity)[:2] == (1, 20)
        assert not redis_client.exists(run.lot.entity_key(ss.STREAM, entity))


def test_a_statement_that_fails_stops_only_its_entity_at_that_step(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """The statement fails at seq 13 for one entity: it stops there, after 1..12; the other
    entity, whose steps end at 12, and a third past the failure in the same batch apply."""
    run = ss.runner(redis_client, redis_prefix, _routes(FAIL_AT_13))
    events = [ss.step(s, "a") for s in range(1, 16)] + [ss.step(s, "b") for s in range(1, 13)]
    with steps_db.connect(autocommit=True) as conn:
        ss.feed(run, conn, events)
    _, last, _, stopped_at, reason = ss.progress(steps_db, "a")
    assert (last, stopped_at) == (12, 13)
    assert "division by zero" in reason
    assert ss.applied(steps_db, "a") == [(1, s) for s in range(1, 13)]
    assert redis_client.zcard(run.lot.entity_key(ss.STREAM, "a")) == 3  # 13 to 15 wait
    assert ss.applied(steps_db, "b") == [(1, s) for s in range(1, 13)]
    assert ss.progress(steps_db, "b")[3] is None


def test_statements_and_external_calls_of_one_entity_keep_its_order_in_lanes(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """An entity whose steps alternate external calls and statements, in lanes: the rows
    of both land in seq order, each once."""
    external = (
        '[route.handlers."ledger.mailed"]\n'
        'function = "tests.integration.step_handlers:slow_call"\nexternal = true\n'
        "idempotent = true\n"
    )
    run = ss.runner(
        redis_client,
        redis_prefix,
        _routes(RECORD, lanes=4, extra=external),
        database_url=steps_db.url,
    )
    entities = [f"m{i}" for i in range(6)]
    kinds = ["ledger.added", "ledger.mailed", "ledger.added", "ledger.added", "ledger.mailed"]
    events = [
        ss.step(seq, e, event_type=kind) for e in entities for seq, kind in enumerate(kinds, 1)
    ]
    step_handlers.SLOW_CALLS.clear()
    with steps_db.connect(autocommit=True) as conn:
        assert ss.feed(run, conn, events[::-1]) == []
    run.lanes.close()
    for entity in entities:
        assert ss.applied(steps_db, entity) == [(1, s) for s in range(1, 6)]


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("INSERT INTO no_such_table (seq) VALUES (%(seq)s)", 'relation "no_such_table"'),
        ("INSERT INTO applied_steps (no_such_column) VALUES (%(seq)s)", "no_such_column"),
        ("INSERT INTO applied_steps VALUES (%(seq)s", "syntax error"),
    ],
)
def test_a_statement_that_does_not_prepare_stops_start_up_with_one_line(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, sql: str, why: str
) -> None:
    """A missing table, a missing column or a syntax error: refused at start-up, one line
    naming the route, the handler and the server's reason; nothing is written."""
    with pytest.raises(RoutesError) as refused:
        ss.runner(redis_client, redis_prefix, _routes(sql), database_url=steps_db.url)
    [line] = refused.value.problems
    assert line.startswith(f"route {ss.STREAM}: sql of handler ledger.added does not prepare: ")
    assert why in line
    assert ss.applied(steps_db, "a") == []
