"""Several streams, one read model: each stream's columns at its own newest version, in any order.

The table and the routes are the consumer README's recipe, as a user would copy them.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer.errors import RoutesError
from consumer.kinds import KINDS
from consumer.kinds._audit import Audit
from consumer.kinds.projection import ProjectionRoute, apply, check_table
from consumer.routes import parse_routes
from schemas import Event
from tests.conftest import PgSchema, TopicFactory
from tests.integration import sweeper_support as sw
from tests.support.docs import CONSUMER, example
from tests.support.kafka import wait_until
from tests.support.services import Services

TABLE = example("several-sources-table", CONSUMER)
ROUTES = example("several-sources-routes", CONSUMER)
CUSTOMERS = ("c1", "c2", "c3")
VERSIONS = [(g, s) for g in (1, 2) for s in range(1, 7)]
PLANS = ("free", "basic", "pro", "enterprise")


def _routes() -> list[ProjectionRoute]:
    return [r for r in parse_routes(ROUTES) if isinstance(r, ProjectionRoute)]


def _payload(stream: str, generation: int, seq: int) -> dict[str, Any]:
    """A full-state payload that says which version wrote it."""
    if stream == "plan":
        return {"plan": PLANS[(generation + seq) % 4], "seats": generation * 100 + seq}
    return {"balance_cents": generation * 1000 + seq, "due_on": f"2026-{generation:02d}-{seq:02d}"}


def _event(stream: str, customer: str, generation: int, seq: int) -> Event:
    return Event(
        f"{stream}:{customer}:{generation}:{seq}",
        f"{stream}.changed",
        stream,
        customer,
        generation,
        seq,
        "2026-12-01T10:00:00Z",
        "2026-12-01T10:00:01Z",
        _payload(stream, generation, seq),
    )


def _expected(events: list[Event]) -> dict[str, tuple[Any, ...]]:
    """Each customer's row as the two sources' newest versions make it (None: never written)."""
    newest: dict[tuple[str, str], Event] = {}
    for e in events:
        held = newest.get((e.entity_type, e.entity_id))
        if held is None or e.version > held.version:
            newest[(e.entity_type, e.entity_id)] = e
    rows = {}
    for customer in {e.entity_id for e in events}:
        plan, bill = newest.get(("plan", customer)), newest.get(("bill", customer))
        rows[customer] = (
            *(
                (plan.payload["plan"], plan.payload["seats"], *plan.version)
                if plan
                else (None,) * 4
            ),
            *(
                (
                    bill.payload["balance_cents"],
                    date.fromisoformat(bill.payload["due_on"]),
                    *bill.version,
                )
                if bill
                else (None,) * 4
            ),
        )
    return rows


def _rows(db: PgSchema) -> dict[str, tuple[Any, ...]]:
    with db.connect() as conn:
        found = conn.execute(
            "SELECT customer_id, plan, seats, plan_gen, plan_seq, "
            "balance_cents, due_on, bill_gen, bill_seq FROM customer_view"
        ).fetchall()
    return {row[0]: tuple(row[1:]) for row in found}


@pytest.fixture
def customer_view(pg_schema: PgSchema) -> PgSchema:
    """The test's schema with the README's customer_view table in it."""
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(TABLE)
    return pg_schema


_WRITTEN = st.lists(
    st.tuples(
        st.sampled_from(("plan", "bill")), st.sampled_from(CUSTOMERS), st.sampled_from(VERSIONS)
    ),
    min_size=1,
    max_size=40,
    unique=True,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(written=_WRITTEN, data=st.data())
def test_two_streams_merge_by_field_in_any_order_with_duplicates(
    customer_view: PgSchema, written: list[tuple[str, str, tuple[int, int]]], data: st.DataObject
) -> None:
    """Any shuffle, duplicates and batching of two streams' events: each column group ends at
    its own stream's newest version, and every event is applied or counted stale."""
    events = [_event(stream, c, g, s) for stream, c, (g, s) in written]
    duplicates = data.draw(st.lists(st.sampled_from(events), max_size=20))
    delivered = data.draw(st.permutations(events + duplicates))
    cuts = sorted(data.draw(st.lists(st.integers(1, len(delivered)), max_size=6, unique=True)))
    with customer_view.connect(autocommit=True) as conn:
        conn.execute("TRUNCATE customer_view")
        tables = {r.stream: check_table(conn, r) for r in _routes()}
        counted = 0
        for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
            batch = delivered[start:end]
            order = data.draw(st.permutations(sorted(tables)))  # which route applies first
            with conn.transaction():
                for stream in order:
                    outcome = apply(
                        conn, tables[stream], [e for e in batch if e.entity_type == stream]
                    )
                    assert not outcome.refused
                    counted += len(outcome.applied) + len(outcome.stale)
    assert counted == len(delivered)
    assert _rows(customer_view) == _expected(events)


def test_a_row_the_other_stream_created_takes_this_stream_s_oldest_event(
    customer_view: PgSchema,
) -> None:
    """Bill creates the row; plan's first event (1/1) still lands, and bill's columns stay."""
    tables = {r.stream: check_table_now(customer_view, r) for r in _routes()}
    with customer_view.connect(autocommit=True) as conn:
        with conn.transaction():
            bill = apply(conn, tables["bill"], [_event("bill", "c1", 1, 5)])
        with conn.transaction():
            plan = apply(conn, tables["plan"], [_event("plan", "c1", 1, 1)])
        with conn.transaction():
            late = apply(conn, tables["bill"], [_event("bill", "c1", 1, 4)])
    assert [len(o.applied) for o in (bill, plan, late)] == [1, 1, 0]
    assert _rows(customer_view)["c1"] == ("pro", 101, 1, 1, 1005, date(2026, 1, 5), 1, 5)


def check_table_now(db: PgSchema, route: ProjectionRoute) -> Any:
    """The route's table checked on a connection of its own."""
    with db.connect() as conn:
        return check_table(conn, route)


def test_two_sources_through_the_relay_and_consumer_audit_clean_and_are_explained(
    customer_view: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Outbox rows of both streams, sent by the relay over three partitions and projected by
    the consumer: one row per customer with both sources' newest columns; audit clean; explain
    shows what its stream wrote and the whole row."""
    p = sw.pipeline(
        customer_view, services, topic_factory, tmp_path, redis_prefix, routes_text=ROUTES
    )
    events = [
        _event(stream, c, g, s)
        for c in CUSTOMERS
        for stream in ("plan", "bill")
        for g, s in VERSIONS[: 3 if stream == "plan" else 5]
    ]
    events += [_event("plan", "c4", 1, 1)]  # a customer only one source knows
    ordered = sorted(events, key=lambda e: (e.seq % 3, e.entity_id, e.entity_type))
    with customer_view.connect() as conn:
        for e in ordered:
            conn.execute(
                "INSERT INTO outbox (topic, entity_type, entity_id, generation, seq, event_type, "
                "event_id, payload) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    p.topics.events,
                    e.entity_type,
                    e.entity_id,
                    e.generation,
                    e.seq,
                    e.event_type,
                    e.event_id,
                    orjson.dumps(e.payload).decode(),
                ),
            )
        conn.commit()
    expected = _expected(events)
    with sw.running(p, sweeper=False):
        wait_until(lambda: _rows(customer_view) == expected, timeout_s=60)
    assert expected["c4"][4:] == (None,) * 4

    done = sw.admin(p, "--json", "audit")
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"divergences":0' in done.stdout
    assert '"entities":7' in done.stdout  # c1..c4 of plan, c1..c3 of bill

    story = orjson.loads(sw.admin(p, "--json", "explain", "bill:c2").stdout)
    assert story["applied"] == {
        "generation": 1,
        "seq": 5,
        "balance_cents": 1005,
        "due_on": "2026-01-05",
    }
    [row] = story["row"]
    assert (row["plan"], row["plan_gen"], row["plan_seq"]) == ("free", 1, 3)
    assert (row["bill_gen"], row["bill_seq"]) == (1, 5)
    assert story["verdict"] == "consistent with the outbox"
    alone = orjson.loads(sw.admin(p, "--json", "explain", "bill:c4").stdout)
    assert alone["applied"] is None  # plan wrote the row; bill never did


def test_a_column_two_routes_write_stops_start_up_in_one_line(
    tmp_path: Path, services: Services
) -> None:
    """The recipe with `seats` in both routes: exit 2, one line naming both and the column."""
    bad = tmp_path / "routes.toml"
    bad.write_text(ROUTES.replace('due_on = "due_on"', 'seats = "seats"'))
    done = subprocess.run(
        [sys.executable, "-m", "consumer"],
        env={
            "PATH": "/usr/bin:/bin",
            "DATABASE_URL": "postgresql://x@127.0.0.1:1/x",
            "KAFKA_BOOTSTRAP_SERVERS": services.kafka_bootstrap,
            "INORDER_ROUTES_FILE": str(bad),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "inorder-consumer: routes plan and bill (table customer_view): both write seats; "
        "streams merged into one row must each own their columns and their own "
        "generation_column and seq_column (route a field two services change through one owner)"
    ]


KEPT_APART = """
[[route]]
stream = "plan"
kind = "projection"
table = "named"
key = "id"
entity_type_column = "kind"
[route.columns]
name = "name"

[[route]]
stream = "bill"
kind = "projection"
table = "named"
key = "id"
entity_type_column = "kind"
[route.columns]
name = "name"
"""


def test_rows_kept_apart_by_entity_type_are_each_audited_against_their_own_stream(
    outbox: PgSchema,
) -> None:
    """Two streams with rows of their own in one table, same entity ids: the audit reads each
    stream's rows only, and finds them consistent; a changed row is named under its stream."""
    routes = [r for r in parse_routes(KEPT_APART) if isinstance(r, ProjectionRoute)]
    with outbox.connect(autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE named (kind text, id text, name text, generation bigint NOT NULL, "
            "seq bigint NOT NULL, PRIMARY KEY (kind, id))"
        )
        written = [
            Event(
                f"{s}:{c}:{q}",
                f"{s}.changed",
                s,
                c,
                1,
                q,
                "2026-12-01T10:00:00Z",
                "2026-12-01T10:00:01Z",
                {"name": f"{s}-{c}-{q}"},
            )
            for s in ("plan", "bill")
            for c in ("c1", "c2")
            for q in (1, 2, 3)
            if not (s == "bill" and q == 3)
        ]
        for e in written:
            conn.execute(
                "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
                "payload) VALUES ('t', %s, %s, %s, %s, %s, %s)",
                (
                    e.entity_type,
                    e.entity_id,
                    e.seq,
                    e.event_type,
                    e.event_id,
                    orjson.dumps(e.payload).decode(),
                ),
            )
        for route in routes:
            with conn.transaction():
                apply(
                    conn,
                    check_table(conn, route),
                    [e for e in written if e.entity_type == route.stream],
                )
        clean = Audit(conn, conn, KINDS).run(routes)
        conn.execute("UPDATE named SET name = 'changed' WHERE kind = 'bill' AND id = 'c2'")
        changed = Audit(conn, conn, KINDS).run(routes)
    assert (clean.entities, clean.divergences) == (4, [])
    assert [(d.route, d.entity_id, d.detail) for d in changed.divergences] == [
        ("bill", "c2", "column name is 'changed', event says 'bill-c2-2'")
    ]


def test_another_stream_s_not_null_column_stops_start_up_in_one_line(pg_schema: PgSchema) -> None:
    """The recipe's table with plan NOT NULL: bill could never create a row, so its route is
    refused at start-up, one line naming the column; plan's route, which writes it, is not."""
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(TABLE.replace("plan          text,", "plan          text NOT NULL,"))
        plan, bill = _routes()
        check_table(conn, plan)
        with pytest.raises(RoutesError) as refused:
            check_table(conn, bill)
    assert refused.value.problems == [
        "route bill: table customer_view column 'plan' is NOT NULL without a default and the "
        "route does not write it, so no new row could be stored; give it a default, allow "
        "NULL (another stream's column, in a table several streams feed) or map it"
    ]
