"""The least a lane can do for a step that calls out: the lanes benchmark's yardstick.

``steps_per_s`` runs ``lanes`` lanes over ``entities`` entities of three steps each, as
the lanes benchmark does, with no Kafka, no consumer and no plan: each lane takes the
next entity and, per step, sends one script that records the call's attempt and commits
it on its own (without waiting for the disk, as for an idempotent call), then begins
the step's transaction and claims the entity's progress; waits 50 ms (the call); writes
the step's row with the same statement as the benchmark's handler; and sends one script
that logs the step and commits. Threads on connections of their own, or (``awaited``)
coroutines on one event loop with async connections. Every round trip, commit and
thread hand-off it takes, a correct consumer takes too (the attempt's own commit: a
call that may have been made is known to have been tried whatever becomes of the
step's transaction; inorder's lanes send the next step's opening with the closing, one
round trip less); run beside the consumer on the same machine, it shows what the
machine allows any lanes at that width.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from tests.benchmarks.machine import SessionsCpu
from tests.integration import step_handlers

APP = "lean-lanes"
CALL_S = 0.05
STEPS = 3
_TABLES = """
DROP TABLE IF EXISTS lean_progress, lean_attempts, lean_log;
CREATE TABLE lean_progress (entity_id text PRIMARY KEY, last_applied bigint NOT NULL);
CREATE TABLE lean_attempts (entity_id text, seq bigint, started_at timestamptz DEFAULT now());
CREATE TABLE lean_log (entity_id text, seq bigint, applied_at timestamptz DEFAULT now());
"""
_RECORD = (
    "INSERT INTO applied_steps (entity_id, generation, seq, event_type)"
    " VALUES (%s, 1, %s, 'ledger.added')"
)


# Entity names are the benchmark's own (``lean<n>``): spliced in as a script, the way the
# consumer's lanes send theirs, one round trip each.
def _opening(entity: str, seq: int) -> str:
    attempt = f"INSERT INTO lean_attempts (entity_id, seq) VALUES ('{entity}', {seq})"  # noqa: S608
    claim = f"UPDATE lean_progress SET last_applied = {seq} WHERE entity_id = '{entity}'"  # noqa: S608
    return (
        f"BEGIN; SET LOCAL synchronous_commit TO off; {attempt}; COMMIT; "
        f"BEGIN; {claim} AND last_applied = {seq - 1}"
    )


def _closing(entity: str, seq: int) -> str:
    return f"INSERT INTO lean_log (entity_id, seq) VALUES ('{entity}', {seq}); COMMIT"  # noqa: S608


def _fresh(url: str, entities: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_TABLES)
        conn.execute(step_handlers.TABLE.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))
        conn.execute("TRUNCATE applied_steps")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO lean_progress VALUES (%s, 0)", [(entity,) for entity in entities]
            )


@dataclass(slots=True)
class _Span:
    """Wall and CPU time (this process and its ``APP`` sessions) of the lanes' run, their
    connections opened before it."""

    url: str
    seconds: float = 0.0
    cpu_s: float = 0.0

    @contextmanager
    def timed(self) -> Iterator[None]:
        with SessionsCpu(self.url, APP) as cpu:
            started = time.monotonic()
            yield
            ended = time.monotonic()
        self.seconds, self.cpu_s = ended - started, cpu.between(started, ended)


def _threads(url: str, lanes: int, entities: list[str], span: _Span) -> None:
    todo: queue.SimpleQueue[str] = queue.SimpleQueue()
    for entity in entities:
        todo.put(entity)

    def lane(conn: psycopg.Connection[Any]) -> None:
        while True:
            try:
                entity = todo.get_nowait()
            except queue.Empty:
                return
            for seq in range(1, STEPS + 1):
                conn.execute(_opening(entity, seq))
                time.sleep(CALL_S)
                conn.execute(_RECORD, (entity, seq))
                conn.execute(_closing(entity, seq))

    conns = [psycopg.connect(url, autocommit=True, application_name=APP) for _ in range(lanes)]
    try:
        threads = [threading.Thread(target=lane, args=(c,)) for c in conns]
        with span.timed():
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        for conn in conns:
            conn.close()


async def _loop(url: str, lanes: int, entities: list[str], span: _Span) -> None:
    todo: asyncio.Queue[str] = asyncio.Queue()
    for entity in entities:
        todo.put_nowait(entity)

    async def lane(aconn: psycopg.AsyncConnection[Any]) -> None:
        while not todo.empty():
            entity = todo.get_nowait()
            for seq in range(1, STEPS + 1):
                await aconn.execute(_opening(entity, seq))
                await asyncio.sleep(CALL_S)
                await aconn.execute(_RECORD, (entity, seq))
                await aconn.execute(_closing(entity, seq))

    conns = [
        await psycopg.AsyncConnection.connect(url, autocommit=True, application_name=APP)
        for _ in range(lanes)
    ]
    try:
        with span.timed():
            await asyncio.gather(*(lane(c) for c in conns))
    finally:
        for aconn in conns:
            await aconn.close()


def steps_per_s(
    url: str, lanes: int, entities: int, *, awaited: bool = False
) -> tuple[float, float]:
    """Steps per second, and CPU milliseconds a step (this process and its backends)."""
    names = [f"lean{e}" for e in range(entities)]
    _fresh(url, names)
    span = _Span(url)
    if awaited:
        asyncio.run(_loop(url, lanes, names, span))
    else:
        _threads(url, lanes, names, span)
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM applied_steps").fetchone()
    if not row or row[0] != entities * STEPS:
        raise RuntimeError(f"lean lanes wrote {row} steps of {entities * STEPS}")
    steps = entities * STEPS
    return steps / span.seconds, span.cpu_s * 1000 / steps
