"""Load generator for the example service: N entities x M operations from K concurrent writers.

Writers share one queue of operations in random order, so several of them change
the same entity at once: commits interleave, versions are decided by the row
lock, and the outbox ``id`` order (insert order) differs from commit order.

With ``rate`` set the writers keep a steady pace instead of going flat out, and a
writer whose connection breaks (PostgreSQL restarted) reconnects with backoff and
tries the operation again, so load keeps coming through faults of the database.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog

from producer import subscriptions as subs
from producer.errors import EntityExistsError
from schemas.runtime import postgres
from schemas.runtime.backoff import Backoff
from schemas.runtime.logs import first_line

log = structlog.get_logger("inorder.loadgen")

PLANS = tuple(subs.PLAN_PRICES_CENTS)
# Events written by each operation: create and cycle touch both entity streams.
EVENTS_PER_OP = {"create": 2, "plan": 1, "seats": 1, "cycle": 4}


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What to generate: ``ops_per_entity`` includes the creation."""

    entities: int
    ops_per_entity: int
    writers: int
    prefix: str = "sub-"
    seed: int = 1
    # Share of operations that delete and re-create the entity (a new generation).
    cycle_share: float = 0.05
    # Share of operations that add seats; the rest change the plan.
    seats_share: float = 0.4
    # Operations per second over all writers; None: as fast as the writers go.
    rate: float | None = None


@dataclass(frozen=True, slots=True)
class Operation:
    """One state change of one entity, run in its own transaction."""

    kind: str
    entity_id: str
    arg: Any = None


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What was written, and how fast."""

    operations: int
    events: int
    seconds: float
    # Operations tried again on a new connection after the old one broke.
    retried: int = 0

    @property
    def events_per_s(self) -> float:
        """Outbox rows written per second."""
        return self.events / self.seconds if self.seconds > 0 else 0.0


def entity_ids(plan: LoadPlan) -> list[str]:
    """The ids of the plan's entities."""
    return [f"{plan.prefix}{i:06d}" for i in range(plan.entities)]


def operations(plan: LoadPlan) -> list[Operation]:
    """The plan's operations after the creates, shuffled across entities (pure)."""
    rng = random.Random(plan.seed)  # noqa: S311 - a reproducible load mix, not a secret
    ops = []
    for entity in entity_ids(plan):
        for _ in range(plan.ops_per_entity - 1):
            roll = rng.random()
            if roll < plan.cycle_share:
                ops.append(Operation("cycle", entity, rng.choice(PLANS)))
            elif roll < plan.cycle_share + plan.seats_share:
                ops.append(Operation("seats", entity, rng.randint(1, 5)))
            else:
                ops.append(Operation("plan", entity, rng.choice(PLANS)))
    rng.shuffle(ops)
    return ops


def apply(conn: psycopg.Connection[Any], op: Operation, topic: str) -> None:
    """Run one operation in its own transaction."""
    if op.kind == "create":
        subs.create_subscription(conn, op.entity_id, op.arg, topic=topic)
    elif op.kind == "plan":
        subs.change_plan(conn, op.entity_id, op.arg, topic=topic)
    elif op.kind == "seats":
        subs.add_seats(conn, op.entity_id, op.arg, topic=topic)
    else:
        with conn.transaction():
            subs.delete_subscription(conn, op.entity_id, topic=topic)
            subs.recreate_subscription(conn, op.entity_id, op.arg, topic=topic)


class Pacer:
    """Hands out start times ``1 / rate`` apart to any number of threads (None: no pacing)."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self.next_at = time.monotonic()
        self.lock = threading.Lock()

    def wait(self) -> None:
        """Sleep until this caller's turn."""
        if not self.interval:
            return
        with self.lock:
            now = time.monotonic()
            # A writer that fell behind (a fault) does not earn a burst afterwards.
            slot = max(self.next_at, now)
            self.next_at = slot + self.interval
        if slot > now:
            time.sleep(slot - now)


@dataclass(slots=True)
class _Writers:
    conninfo: str
    topic: str
    advance: Callable[[], None]
    pacer: Pacer
    errors: list[Exception]
    retried: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # the writers share retried

    def run(self, work: queue.Queue[Operation]) -> None:
        try:
            conn: psycopg.Connection[Any] | None = None
            while not self.errors:
                try:
                    op = work.get_nowait()
                except queue.Empty:
                    return
                self.pacer.wait()
                conn = self._apply(conn, op)
                self.advance()
        except Exception as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            self.errors.append(exc)
        finally:
            if conn is not None:
                conn.close()

    def _apply(
        self, conn: psycopg.Connection[Any] | None, op: Operation
    ) -> psycopg.Connection[Any]:
        """Apply ``op``, reconnecting while the database is unreachable; the live connection."""
        backoff = Backoff(base_s=0.2, max_s=5.0)
        tried = False
        while True:
            if conn is None or conn.closed:
                conn = self._connect(backoff)
            try:
                apply(conn, op, self.topic)
            except EntityExistsError:
                if not tried:
                    raise  # a real clash, not a commit that went through before the break
            except psycopg.OperationalError as exc:
                conn.close()
                tried = True
                self._retry_later(backoff, op, exc)
                continue
            return conn

    def _connect(self, backoff: Backoff) -> psycopg.Connection[Any]:
        while True:
            try:
                return postgres.connect(self.conninfo, "inorder-loadgen", autocommit=False)
            except psycopg.OperationalError as exc:
                self._retry_later(backoff, None, exc)

    def _retry_later(self, backoff: Backoff, op: Operation | None, exc: Exception) -> None:
        with self.lock:
            self.retried += op is not None
        delay = backoff.failed()
        log.warning(
            "loadgen_retry",
            op=op and op.kind,
            entity=op and op.entity_id,
            error=first_line(exc),
            retry_in_s=delay,
        )
        time.sleep(delay)


def _run_writers(writers: _Writers, work: queue.Queue[Operation], count: int) -> None:
    threads = [
        threading.Thread(target=writers.run, args=(work,), name=f"writer-{i}") for i in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if writers.errors:
        raise writers.errors[0]


def run(
    conninfo: str, plan: LoadPlan, topic: str, advance: Callable[[], None] = lambda: None
) -> LoadReport:
    """Create the plan's entities, then run its operations from ``plan.writers`` threads."""
    creates = [
        Operation("create", e, PLANS[i % len(PLANS)]) for i, e in enumerate(entity_ids(plan))
    ]
    started = time.perf_counter()
    total_ops = 0
    events = 0
    writers = _Writers(conninfo, topic, advance, Pacer(plan.rate), [])
    for phase in (creates, operations(plan)):
        work: queue.Queue[Operation] = queue.Queue()
        for op in phase:
            work.put(op)
        _run_writers(writers, work, plan.writers)
        total_ops += len(phase)
        events += sum(EVENTS_PER_OP[op.kind] for op in phase)
    return LoadReport(total_ops, events, time.perf_counter() - started, writers.retried)
