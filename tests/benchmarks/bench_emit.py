"""emit_per_s: outbox writes with one event per transaction against many per transaction.

All three variants write the same kind of event into the same table in one run,
in a schema of their own that is dropped afterwards. ``outbox_sql_us_per_row``: what
a producer writing plain SQL pays the table for each row (its checks, its stamp, its
indexes), in one multi-row ``INSERT .. SELECT``, with the table's rules as shipped and
with the rules of migration 0006 put back in a second schema, side by side. The suite
runs three times, each after the baseline's (``ROUNDS``), and reports medians.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from producer import OutboxEvent, emit, emit_many, migrate
from tests.benchmarks.fixtures import temp_schema
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized

# emit() sits near 0.1.0's cost, where one pair of runs moves by a tenth either way: three
# rounds, alternated with the baseline's, each side reporting its medians.
ROUNDS = sized(3, 1)
SINGLE = sized(2000, 100)
SQL_ROWS = sized(20000, 1000)
MIGRATIONS = Path(__file__).resolve().parents[2] / "schemas" / "outbox" / "migrations"
_PLAIN_INSERT = (
    "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload, "
    "headers) SELECT 'events', 'subscription', %(tag)s || g, 1, 'subscription.plan_changed', "
    '%(tag)s || g, \'{"plan": "pro", "price_cents": 2900}\', '
    '\'{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}\' '
    "FROM generate_series(1, %(rows)s) g"
)
BATCHED = sized(20000, 400)
PER_TX = 200
PAYLOAD = {"plan": "pro", "price_cents": 2900, "status": "active"}


def _events(tag: str, count: int) -> list[OutboxEvent]:
    return [
        OutboxEvent("subscription", f"{tag}-{i}", 1, "subscription.plan_changed", PAYLOAD)
        for i in range(count)
    ]


def _one_per_tx(conn: psycopg.Connection[Any], events: list[OutboxEvent]) -> None:
    for event in events:
        with conn.transaction():
            emit(conn, event)


def _emit_per_event(conn: psycopg.Connection[Any], events: list[OutboxEvent]) -> None:
    for start in range(0, len(events), PER_TX):
        with conn.transaction():
            for event in events[start : start + PER_TX]:
                emit(conn, event)


def _emit_many(conn: psycopg.Connection[Any], events: list[OutboxEvent]) -> None:
    for start in range(0, len(events), PER_TX):
        with conn.transaction():
            emit_many(conn, events[start : start + PER_TX])


def _rate(
    conn: psycopg.Connection[Any], write: Callable[..., None], events: list[OutboxEvent]
) -> float:
    started = time.perf_counter()
    write(conn, events)
    return len(events) / (time.perf_counter() - started)


def _rules_of_0006() -> str:
    """The row trigger's function as migration 0006 made it."""
    text = (MIGRATIONS / "0006_rules_on_insert.sql").read_text()
    start = text.index("CREATE OR REPLACE FUNCTION inorder_outbox_stamp()")
    return text[start : text.index("$$;", start) + 3]


def _sql_us_per_row(conn: psycopg.Connection[Any], tag: str) -> float:
    """Microseconds a row of one multi-row plain SQL insert takes, best of three."""
    best = float("inf")
    for attempt in range(3):
        started = time.perf_counter()
        conn.execute(_PLAIN_INSERT, {"tag": f"{tag}-{attempt}-", "rows": SQL_ROWS})
        best = min(best, time.perf_counter() - started)
    return best / SQL_ROWS * 1e6


def run() -> list[BenchResult]:
    """Rates of the three ways to write the outbox, measured side by side."""
    url = os.environ["DATABASE_URL"]
    with (
        temp_schema(url, "bench_emit") as here,
        temp_schema(url, "bench_emit_0006") as before,
        psycopg.connect(here, autocommit=True) as conn,
        psycopg.connect(before, autocommit=True) as old,
    ):
        migrate.apply(conn)
        migrate.apply(old)
        old.execute(_rules_of_0006().encode())
        single = _rate(conn, _one_per_tx, _events("single", SINGLE))
        batched = _rate(conn, _emit_per_event, _events("batched", BATCHED))
        many = _rate(conn, _emit_many, _events("many", BATCHED))
        sql_then = _sql_us_per_row(old, "then")
        sql_now = _sql_us_per_row(conn, "now")
    return [
        BenchResult(
            "outbox_sql_us_per_row.shipped", sql_now, "us/row", f"INSERT .. SELECT of {SQL_ROWS}"
        ),
        BenchResult(
            "outbox_sql_us_per_row.rules_of_0006", sql_then, "us/row", "the same, 0006's trigger"
        ),
        BenchResult("emit_per_s.one_per_tx", single, "rows/s", f"{SINGLE} transactions of 1"),
        BenchResult(
            "emit_per_s.emit_in_tx", batched, "rows/s", f"emit() x{PER_TX} per transaction"
        ),
        BenchResult("emit_per_s.emit_many", many, "rows/s", f"emit_many() of {PER_TX} per tx"),
        BenchResult("emit_batched_vs_single", many / single, "x", "emit_many / one per tx"),
    ]
