"""Several consumers holding one entity's step events at the same moment (a share group's
members), against real PostgreSQL and Redis: every step once, in order, no call made twice."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer.kinds.steps import StepApplier
from schemas import Event
from tests.conftest import PgSchema
from tests.integration import step_handlers
from tests.integration import step_support as ss

# Not idempotent: a call a second member took for a cut one would stop the entity.
from tests.integration.test_step_lanes import _text


def _member(run: StepApplier, db: PgSchema, batches: list[list[Event]]) -> None:
    """One member: its batches in turn, lanes going on past each as in the loop, then done."""
    try:
        with db.connect(autocommit=True) as conn:
            for batch in batches:
                assert ss.feed(run, conn, batch) == []
                run.collect(0.0)
            assert ss.settle(run) == []
    finally:
        run.lanes.close()


def _deal(
    rng: random.Random, delivered: list[Event], members: int, most: int
) -> list[list[list[Event]]]:
    """Each member's batches: every record goes to one member, in polls of up to ``most``."""
    dealt: list[list[Event]] = [[] for _ in range(members)]
    for event in delivered:
        dealt[rng.randrange(members)].append(event)
    return [[mine[i : i + most] for i in range(0, len(mine), most)] for mine in dealt]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_members_sharing_entities_apply_each_step_once_in_order(
    steps_db: PgSchema, redis_client: redis.Redis, redis_prefix: str, data: st.DataObject
) -> None:
    """2-4 members, external and plain steps of 4 entities shuffled with copies: once, in order."""
    tag = uuid.uuid4().hex[:8]  # each example its own entities (the schema is shared)
    members = data.draw(st.integers(2, 4))
    lanes = data.draw(st.sampled_from([1, 4]))
    entities = [f"s{tag}-{i}" for i in range(4)]
    kinds = data.draw(st.lists(st.booleans(), min_size=4, max_size=4))
    events = [
        ss.step(seq, entity, event_type="ledger.mailed" if external else "ledger.added")
        for entity in entities
        for seq, external in enumerate(kinds, 1)
    ]
    copies = data.draw(st.lists(st.sampled_from(events), max_size=12))
    delivered = data.draw(st.permutations(events + copies))
    rng = random.Random(data.draw(st.integers(0, 2**16)))
    dealt = _deal(rng, delivered, members, data.draw(st.integers(1, 5)))
    runs = []
    for _ in range(members):
        run = ss.runner(
            redis_client,
            redis_prefix,
            _text(lanes, idempotent=False),  # a call taken twice would stop the entity
            database_url=steps_db.url,
            carry=True,
        )
        run.share()
        runs.append(run)
    step_handlers.SLOW_CALLS.clear()
    with ThreadPoolExecutor(members) as pool:
        for done in [
            pool.submit(_member, r, steps_db, b) for r, b in zip(runs, dealt, strict=True)
        ]:
            done.result(timeout=120)
    for entity in entities:
        assert ss.progress(steps_db, entity) == (1, 4, False, None, None)
        assert ss.applied(steps_db, entity) == [(1, s) for s in range(1, 5)]
    calls = Counter((e, s) for e, s, _, _ in step_handlers.SLOW_CALLS)
    assert all(n == 1 for n in calls.values()), calls.most_common(3)
    for entity in entities:  # never two calls of one entity at once, whichever member
        spans = sorted((a, b) for e, _, a, b in step_handlers.SLOW_CALLS if e == entity)
        assert all(b1 <= a2 for (_, b1), (a2, _) in pairwise(spans))
