"""Load generator for the example service: N entities x M operations from K concurrent writers.

Writers share one queue of operations in random order, so several of them change
the same entity at once: commits interleave, versions are decided by the row
lock, and the outbox ``id`` order (insert order) differs from commit order.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from producer import subscriptions as subs

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


def _run_writers(
    conninfo: str,
    work: queue.Queue[Operation],
    writers: int,
    topic: str,
    advance: Callable[[], None],
) -> None:
    errors: list[Exception] = []

    def writer() -> None:
        try:
            with psycopg.connect(conninfo) as conn:
                while not errors:
                    try:
                        op = work.get_nowait()
                    except queue.Empty:
                        return
                    apply(conn, op, topic)
                    advance()
        except Exception as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=writer, name=f"writer-{i}") for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


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
    for phase in (creates, operations(plan)):
        work: queue.Queue[Operation] = queue.Queue()
        for op in phase:
            work.put(op)
        _run_writers(conninfo, work, plan.writers, topic, advance)
        total_ops += len(phase)
        events += sum(EVENTS_PER_OP[op.kind] for op in phase)
    return LoadReport(total_ops, events, time.perf_counter() - started)
