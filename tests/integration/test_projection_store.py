"""The conditional upsert against real PostgreSQL: newest version wins in any order."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer.errors import RoutesError
from consumer.kinds.projection import apply, check_table
from consumer.routes import parse_routes
from tests.conftest import PgSchema
from tests.integration import consumer_support as cs


def _table(schema: PgSchema, routes: str = cs.ROUTES):
    with schema.connect() as conn:
        return check_table(conn, parse_routes(routes)[0])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_permutation_with_duplicates_converges_to_the_newest(
    view: PgSchema, data: st.DataObject
) -> None:
    """50 full-state events, shuffled with duplicates, in batches of any size, end as event 50."""
    events = [cs.plan_event("s1", seq) for seq in range(1, 51)]
    duplicates = data.draw(st.lists(st.sampled_from(events), max_size=30))
    delivered = data.draw(st.permutations(events + duplicates))
    cuts = sorted(data.draw(st.lists(st.integers(1, len(delivered) - 1), max_size=8, unique=True)))
    table = _table(view)
    applied = stale = 0
    with view.connect(autocommit=True) as conn:
        conn.execute("TRUNCATE billing_view")
        for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
            with conn.transaction():
                outcome = apply(conn, table, delivered[start:end])
            applied += len(outcome.applied)
            stale += len(outcome.stale)
            assert not outcome.refused
    assert cs.view(view)["s1"] == (1, 50, events[-1].payload["plan"], 5000, "active")
    assert stale == len(delivered) - applied


def test_seed_example_stored_six_then_eight_seven_nine(view: PgSchema) -> None:
    """Stored v6; 8 applies, 7 is stale, 9 applies: the final state is 9's, one stale."""
    table = _table(view)
    with view.connect(autocommit=True) as conn:
        apply(conn, table, [cs.plan_event("s1", 6)])
        outcomes = [apply(conn, table, [cs.plan_event("s1", seq)]) for seq in (8, 7, 9)]
    assert [len(o.applied) for o in outcomes] == [1, 0, 1]
    assert [len(o.stale) for o in outcomes] == [0, 1, 0]
    assert cs.view(view)["s1"][:2] == (1, 9)


def test_recreated_entity_wins_over_the_old_generation(view: PgSchema) -> None:
    """Generation 2, seq 1 is newer than generation 1, seq 40; a late gen-1 event is stale."""
    table = _table(view)
    with view.connect(autocommit=True) as conn:
        apply(conn, table, [cs.plan_event("s1", 40)])
        apply(conn, table, [cs.plan_event("s1", 1, generation=2, plan="basic")])
        late = apply(conn, table, [cs.plan_event("s1", 41)])
    assert len(late.stale) == 1
    assert cs.view(view)["s1"][:3] == (2, 1, "basic")


def test_value_the_column_refuses_rejects_only_that_event(view: PgSchema) -> None:
    """An event whose value does not fit its column is refused alone; the batch's others apply."""
    table = _table(view)
    events = [
        cs.plan_event("s1", 1),
        _with_payload(cs.plan_event("s2", 1), {"price_cents": "lots"}),
    ]
    with view.connect(autocommit=True) as conn, conn.transaction():
        outcome = apply(conn, table, events)
    assert [e.entity_id for e in outcome.applied] == ["s1"]
    assert [(r.event.entity_id, "integer" in r.detail) for r in outcome.refused] == [("s2", True)]


def _with_payload(event, payload):
    from dataclasses import replace  # noqa: PLC0415

    return replace(event, payload=payload)


@pytest.mark.parametrize(
    ("ddl", "problem"),
    [
        ("", "table billing_view does not exist"),
        (
            "CREATE TABLE billing_view (subscription_id text PRIMARY KEY, generation bigint,"
            " seq bigint, plan text, status text)",
            "no column 'price_cents'",
        ),
        (
            "CREATE TABLE billing_view (subscription_id text, generation bigint, seq bigint,"
            " plan text, price_cents int, status text)",
            "needs a primary key or unique index",
        ),
    ],
)
def test_tables_that_do_not_fit_are_refused_at_start(
    pg_schema: PgSchema, ddl: str, problem: str
) -> None:
    """A missing table, a missing column or no unique key is a start-up error naming it."""
    if ddl:
        with pg_schema.connect(autocommit=True) as conn:
            conn.execute(ddl)
    with pytest.raises(RoutesError) as caught:
        _table(pg_schema)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_shuffled_entities_in_one_batch_each_reach_their_newest(view: PgSchema) -> None:
    """Many entities mixed in one batch each end at their own newest version."""
    events = [cs.plan_event(f"s{e}", seq) for e in range(30) for seq in range(1, 21)]
    random.Random(5).shuffle(events)
    table = _table(view)
    with view.connect(autocommit=True) as conn, conn.transaction():
        outcome = apply(conn, table, events)
    assert len(outcome.applied) == 30
    assert {k: v[1] for k, v in cs.view(view).items()} == {f"s{e}": 20 for e in range(30)}
