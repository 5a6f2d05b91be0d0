"""Retries against real PostgreSQL and Redis, any delivery order: each step once, in order."""

from __future__ import annotations

import time
import uuid

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer.kinds import Arrivals, Outcome
from consumer.kinds.steps import StepApplier, failures
from schemas import encode
from tests.conftest import PgSchema
from tests.integration import step_handlers
from tests.integration import step_support as ss

ATTEMPTS = 3


def _routes(then: str) -> str:
    return (
        f'[[route]]\nstream = "{ss.STREAM}"\nkind = "step"\n'
        '[route.handlers."ledger.added"]\n'
        'function = "tests.integration.step_handlers:fail_as_planned"\n'
        f'[route.handlers."ledger.added".retry]\nattempts = {ATTEMPTS}\n'
        f'backoff_s = 0.001\nmax_backoff_s = 0.002\nthen = "{then}"\n'
    )


def _tick(run: StepApplier, conn: object) -> list[Outcome]:
    """What the sweeper's tick does for due retries: resume each entity, then drain it."""
    drained = []
    for entity in failures.due(conn, run.store, 1000):  # type: ignore[arg-type]
        with conn.transaction():  # type: ignore[attr-defined]
            if failures.resume(conn, run.store, entity):  # type: ignore[arg-type]
                drained.append(run.drain(conn, [entity]))  # type: ignore[arg-type]
    return drained


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_retried_steps_apply_once_in_order_whatever_the_delivery(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, data: st.DataObject
) -> None:
    """12 steps shuffled with duplicates, some failing 1-4 times: order kept, each step once."""
    entity = f"e-{uuid.uuid4().hex[:12]}"  # a fresh entity per example, shrunk or not
    then = data.draw(st.sampled_from(["skip", "dead_letter", "stop"]))
    plan = data.draw(st.dictionaries(st.integers(1, 12), st.integers(1, ATTEMPTS + 1), max_size=4))
    step_handlers.FAIL_PLAN.clear()
    step_handlers.FAIL_PLAN.update({(entity, seq): n for seq, n in plan.items()})
    events = [ss.step(seq, entity) for seq in range(1, 13)]
    delivered = data.draw(
        st.permutations(events + data.draw(st.lists(st.sampled_from(events), max_size=6)))
    )
    cuts = sorted(data.draw(st.lists(st.integers(1, len(delivered) - 1), max_size=4, unique=True)))
    run = ss.runner(redis_client, redis_prefix, _routes(then))
    outcomes: list[Outcome] = []
    with steps_db.connect(autocommit=True) as conn:
        for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
            batch = delivered[start:end]
            outcomes.append(run.apply(conn, batch, Arrivals((e, encode(e)) for e in batch)))
            outcomes += _tick(run, conn)
        for _ in range(ATTEMPTS * 13):  # every retry comes due within a few milliseconds
            time.sleep(0.005)
            outcomes += _tick(run, conn)
    given_up = sorted(seq for seq, n in plan.items() if n >= ATTEMPTS)
    expected = list(range(1, 13))
    if then == "stop" and given_up:
        expected = list(range(1, given_up[0]))
    else:
        expected = [s for s in expected if s not in given_up]
    assert ss.applied(steps_db, entity) == [(1, s) for s in expected]
    letters = sorted(r.event.seq for o in outcomes for r in o.refused)
    assert letters == (given_up if then == "dead_letter" else [])
    # A letter for a step given up on in a drain carries the parked bytes it is copied from.
    assert all(
        r.copy is not None or r.event.event_id in {e.event_id for e in delivered}
        for o in outcomes
        for r in o.refused
    )
    stopped = ss.progress(steps_db, entity)[3]
    assert stopped == (given_up[0] if then == "stop" and given_up else None)
