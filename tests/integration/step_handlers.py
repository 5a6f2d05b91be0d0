"""Step functions used by the tests: each records what it applied in ``applied_steps``."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from producer import OutboxEvent, emit
from schemas import Event

TABLE = """
CREATE TABLE applied_steps (
    entity_id text NOT NULL, generation bigint NOT NULL, seq bigint NOT NULL,
    event_type text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    n bigserial
)
"""  # no key on purpose: a step applied twice shows up twice; n is the order of writing
CALLS: list[tuple[str, int]] = []
TRANSACTIONS: list[str] = []  # the transaction each read_then_savepoint call ran in


def record(conn: Any, event: Event) -> None:
    """Append the step to the log table."""
    conn.execute(
        "INSERT INTO applied_steps (entity_id, generation, seq, event_type)"
        " VALUES (%s, %s, %s, %s)",
        (event.entity_id, event.generation, event.seq, event.event_type),
    )


async def record_async(aconn: Any, event: Event) -> None:
    """``record`` on an async connection."""
    await aconn.execute(
        "INSERT INTO applied_steps (entity_id, generation, seq, event_type)"
        " VALUES (%s, %s, %s, %s)",
        (event.entity_id, event.generation, event.seq, event.event_type),
    )


def record_and_emit(conn: Any, event: Event) -> None:
    """Record the step and write a follow-up event to the outbox, in the step's transaction."""
    record(conn, event)
    follow_up = {"count": 1, "seats": event.seq}
    emit(
        conn,
        OutboxEvent(
            "seat_ledger", event.entity_id, event.seq, "seat_ledger.seats_added", follow_up
        ),
    )


def read_then_savepoint(conn: Any, event: Event) -> None:
    """Read a result, then record the step and its transaction's id in a savepoint of its own."""
    conn.execute("SELECT 1").fetchone()
    with conn.transaction():
        record(conn, event)
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        TRANSACTIONS.append(row[0])


def fail_at_13(conn: Any, event: Event) -> None:
    """Record the step, except seq 13, which fails."""
    if event.seq == 13:
        raise ValueError("seq 13 is refused")
    record(conn, event)


def call_out(conn: Any, event: Event) -> None:
    """Stand-in for an external call: remembered in memory, and recorded."""
    CALLS.append((event.entity_id, event.seq))
    record(conn, event)


def bad_sql_for_a_at_13(conn: Any, event: Event) -> None:
    """Record the step; for entity a at seq 13 run SQL that fails (after queuing its insert)."""
    record(conn, event)
    if event.entity_id == "a" and event.seq == 13:
        conn.execute("INSERT INTO no_such_table VALUES (1)")


def nothing(conn: Any, event: Event) -> None:
    """A step with no work of its own, to measure what ordering alone costs."""


def record_many(conn: Any, events: Sequence[Event]) -> None:
    """Append all the steps to the log table in one statement, in the order given."""
    conn.execute(
        "INSERT INTO applied_steps (entity_id, generation, seq, event_type) "
        "SELECT e, g, s, t FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::text[]) "
        "WITH ORDINALITY AS u(e, g, s, t, n) ORDER BY n",
        (
            [e.entity_id for e in events],
            [e.generation for e in events],
            [e.seq for e in events],
            [e.event_type for e in events],
        ),
    )


def fail_at_13_many(conn: Any, events: Sequence[Event]) -> None:
    """Record the steps, unless seq 13 is among them: then refuse them all."""
    if any(e.seq == 13 for e in events):
        raise ValueError("seq 13 is refused")
    record_many(conn, events)


def bad_sql_many_for_a_at_13(conn: Any, events: Sequence[Event]) -> None:
    """Record the steps; if entity a at seq 13 is among them, run SQL that fails too."""
    record_many(conn, events)
    if any(e.entity_id == "a" and e.seq == 13 for e in events):
        conn.execute("INSERT INTO no_such_table VALUES (1)")


MANY_CALLS: list[int] = []


def counted_many(conn: Any, events: Sequence[Event]) -> None:
    """Record the steps and remember how many came in this call."""
    MANY_CALLS.append(len(events))
    record_many(conn, events)


def fail_unless_ok(conn: Any, event: Event) -> None:
    """Record the step for entities named ok-*; every other entity's step raises."""
    if not event.entity_id.startswith("ok-"):
        raise ValueError(f"refused \x00 {event.entity_id}")
    record(conn, event)


def fail_sql_unless_ok(conn: Any, event: Event) -> None:
    """Record the step; for entities not named ok-*, first run SQL that fails."""
    if not event.entity_id.startswith("ok-"):
        conn.execute("SELECT 1 / 0")
    record(conn, event)


SLOW_CALLS: list[tuple[str, int, float, float]] = []  # entity, seq, started, ended


def slow_call(conn: Any, event: Event) -> None:
    """Stand-in for an API that answers in 50 ms: remembered with its times, and recorded."""
    started = time.monotonic()
    time.sleep(0.05)
    SLOW_CALLS.append((event.entity_id, event.seq, started, time.monotonic()))
    record(conn, event)


# One entity in this many answers in ``SLOW_NOW_AND_THEN_S`` instead of 50 ms.
SLOW_EVERY = 100
SLOW_NOW_AND_THEN_S = 1.0


def slow_now_and_then(conn: Any, event: Event) -> None:
    """``slow_call``, except that entities numbered a multiple of ``SLOW_EVERY`` take 1 s."""
    number = int("".join(c for c in event.entity_id if c.isdigit()) or 1)
    if number % SLOW_EVERY:
        slow_call(conn, event)
        return
    started = time.monotonic()
    time.sleep(SLOW_NOW_AND_THEN_S)
    SLOW_CALLS.append((event.entity_id, event.seq, started, time.monotonic()))
    record(conn, event)


def call_out_unless_b(conn: Any, event: Event) -> None:
    """An external call that fails for entity ``b`` at seq 2; the others are remembered."""
    if event.entity_id.endswith("b") and event.seq == 2:
        raise ConnectionError("the mail API answered 503")
    call_out(conn, event)


ASYNC_CALLS: list[tuple[str, int, float, float]] = []  # entity, seq, started, ended


async def slow_call_async(aconn: Any, event: Event) -> None:
    """An async client's 50 ms call, then the step recorded on the async connection."""
    started = time.monotonic()
    await asyncio.sleep(0.05)
    ASYNC_CALLS.append((event.entity_id, event.seq, started, time.monotonic()))
    await record_async(aconn, event)


async def fail_async_for_b(aconn: Any, event: Event) -> None:
    """Record the step, except entity ``...b`` at seq 2, whose async call fails after writing."""
    await record_async(aconn, event)
    if event.entity_id.endswith("b") and event.seq == 2:
        raise TimeoutError("the async API timed out")


CUT: set[tuple[str, int]] = set()  # (entity, seq) whose first call loses its connection


def call_out_or_lose_connection(conn: Any, event: Event) -> None:
    """An external call; for a step named in CUT, the first time, the database connection dies."""
    if (event.entity_id, event.seq) in CUT:
        CUT.discard((event.entity_id, event.seq))
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    call_out(conn, event)


GATE = threading.Event()  # entities named slow… wait here until a test opens it
GATED: list[tuple[str, int]] = []  # (entity, seq) of each call that reached the gate
LOST_ONCE: set[str] = set()  # entities named flaky… whose first call lost the database


def gated_call(conn: Any, event: Event) -> None:
    """An external call: slow… entities wait at ``GATE``, boom… ones fail, flaky… ones lose
    the database once."""
    if event.entity_id.startswith("slow"):
        GATED.append((event.entity_id, event.seq))
        GATE.wait(60)
    if event.entity_id.startswith("boom"):
        raise ConnectionError("the mail API answered 503")
    if event.entity_id.startswith("flaky") and event.entity_id not in LOST_ONCE:
        LOST_ONCE.add(event.entity_id)
        raise psycopg.OperationalError("server closed the connection unexpectedly")
    record(conn, event)


async def gated_call_async(aconn: Any, event: Event) -> None:
    """``gated_call`` awaited: slow… entities wait at ``GATE`` (the loop serving others
    meanwhile), boom… ones fail, flaky… ones lose their connection once (its server
    session ended), the rest record the step."""
    if event.entity_id.startswith("slow"):
        GATED.append((event.entity_id, event.seq))
        await asyncio.to_thread(GATE.wait, 60)
    if event.entity_id.startswith("boom"):
        raise ConnectionError("the mail API answered 503")
    if event.entity_id.startswith("flaky") and event.entity_id not in LOST_ONCE:
        LOST_ONCE.add(event.entity_id)
        await aconn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    await record_async(aconn, event)


def fail_while_flagged(conn: Any, event: Event) -> None:
    """Raises while the file ``INORDER_TEST_FAIL_FLAG`` names exists; records once it is gone."""
    flag = os.environ.get("INORDER_TEST_FAIL_FLAG")
    if flag and Path(flag).exists():
        raise RuntimeError("the ledger service refused the step")
    record(conn, event)


# Calls of seq 3 per entity, for the retry tests (this process's only).
FLAKY: dict[str, int] = {}


def flaky_at_3(conn: Any, event: Event) -> None:
    """Record the step; seq 3 raises TimeoutError at its first two calls (but for ok-*)."""
    if event.seq == 3 and not event.entity_id.startswith("ok-"):
        FLAKY[event.entity_id] = FLAKY.get(event.entity_id, 0) + 1
        if FLAKY[event.entity_id] <= 2:
            raise TimeoutError(f"the ledger service timed out ({FLAKY[event.entity_id]})")
    record(conn, event)


def down_at_3(conn: Any, event: Event) -> None:
    """Record the step; seq 3 always raises ConnectionError (counted in ``FLAKY``)."""
    if event.seq == 3:
        FLAKY[event.entity_id] = FLAKY.get(event.entity_id, 0) + 1
        raise ConnectionError("the ledger service is down")
    record(conn, event)


def flaky_while_flagged(conn: Any, event: Event) -> None:
    """Seq 3 raises TimeoutError while ``INORDER_TEST_FAIL_FLAG`` exists (any process)."""
    flag = os.environ.get("INORDER_TEST_FAIL_FLAG")
    if event.seq == 3 and flag and Path(flag).exists():
        raise TimeoutError("the ledger service timed out")
    record(conn, event)


# Failures to raise per (entity, seq) before a call passes, for the retry property test.
FAIL_PLAN: dict[tuple[str, int], int] = {}


def fail_as_planned(conn: Any, event: Event) -> None:
    """Record the step once ``FAIL_PLAN`` has no failure left for it; until then, time out."""
    key = (event.entity_id, event.seq)
    if FAIL_PLAN.get(key, 0) > 0:
        FAIL_PLAN[key] -= 1
        raise TimeoutError(f"planned failure of seq {event.seq}")
    record(conn, event)
