"""emit_per_s: outbox writes with one event per transaction against many per transaction.

All three variants write the same kind of event into the same table in one run,
in a schema of their own that is dropped afterwards.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import psycopg

from producer import OutboxEvent, emit, emit_many, migrate
from tests.benchmarks.fixtures import temp_schema
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized

SINGLE = sized(2000, 100)
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


def run() -> list[BenchResult]:
    """Rates of the three ways to write the outbox, measured side by side."""
    with (
        temp_schema(os.environ["DATABASE_URL"], "bench_emit") as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        migrate.apply(conn)
        single = _rate(conn, _one_per_tx, _events("single", SINGLE))
        batched = _rate(conn, _emit_per_event, _events("batched", BATCHED))
        many = _rate(conn, _emit_many, _events("many", BATCHED))
    return [
        BenchResult("emit_per_s.one_per_tx", single, "rows/s", f"{SINGLE} transactions of 1"),
        BenchResult(
            "emit_per_s.emit_in_tx", batched, "rows/s", f"emit() x{PER_TX} per transaction"
        ),
        BenchResult("emit_per_s.emit_many", many, "rows/s", f"emit_many() of {PER_TX} per tx"),
        BenchResult("emit_batched_vs_single", many / single, "x", "emit_many / one per tx"),
    ]
