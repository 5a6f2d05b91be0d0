"""A step share decided whole and pure: claims, cuts and one-by-one entities, over any batch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.kinds.steps.plan import Progress, claimed, firsts, share
from schemas import Event

ENTITIES = ("a", "b", "c", "d", "e")
EXTERNAL = "l.call"


def _event(entity: str, seq: int, generation: int, event_type: str) -> Event:
    return Event(
        f"{entity}:{generation}:{seq}", event_type, "l", entity, generation, seq, "t", "t", {}
    )


# Each entity: where it stood, and its events of the batch (duplicates and any order).
_entity = st.tuples(
    st.builds(Progress, st.integers(1, 2), st.integers(0, 3), st.booleans()),
    st.lists(
        st.tuples(st.integers(1, 7), st.integers(1, 2), st.sampled_from(["l.x", EXTERNAL])),
        min_size=1,
        max_size=8,
    ),
)


@given(
    batch=st.dictionaries(st.sampled_from(ENTITIES), _entity, min_size=1),
    limits=st.dictionaries(st.sampled_from(ENTITIES), st.tuples(st.just(1), st.integers(1, 7))),
    earlier=st.sets(st.sampled_from(ENTITIES)),
)
def test_a_share_claims_exactly_the_runs_it_may_apply_together(
    batch: dict[str, tuple[Progress, list[tuple[int, int, str]]]],
    limits: dict[str, tuple[int, int]],
    earlier: set[str],
) -> None:
    """Claims: entities with steps to apply, none external, none gone one by one before."""
    progress = {entity: start for entity, (start, _) in batch.items()}
    events = {
        entity: [_event(entity, seq, generation, kind) for seq, generation, kind in evs]
        for entity, (_, evs) in batch.items()
    }
    given_earlier = set(earlier)
    decided = share(progress, events, limits, earlier, lambda e: e.event_type == EXTERNAL)
    assert earlier == given_earlier  # the caller's set is left alone
    assert set(decided.plans) == set(events)
    assert decided.one_by_one >= earlier
    claims = {entity: (start, end) for entity, start, end in decided.claims}
    assert [entity for entity, _, _ in decided.claims] == sorted(claims)
    for entity, entity_plan in decided.plans.items():
        limit = limits.get(entity)
        assert all(limit is None or e.version < limit for e in entity_plan.apply)
        external = any(e.event_type == EXTERNAL for e in entity_plan.apply)
        if entity in claims:
            assert entity_plan.apply
            assert not external
            assert entity not in decided.one_by_one
            last = entity_plan.apply[-1]
            assert claims[entity] == (progress[entity], Progress(last.generation, last.seq))
        elif entity_plan.apply:
            assert entity in decided.one_by_one
        if external and entity_plan.apply and entity not in earlier:
            assert entity in decided.one_by_one


@given(
    batch=st.dictionaries(st.sampled_from(ENTITIES), st.integers(1, 4), min_size=1),
    won=st.sets(st.sampled_from(ENTITIES)),
)
def test_a_claim_lost_to_another_consumer_turns_its_run_stale(
    batch: dict[str, int], won: set[str]
) -> None:
    """Won claims run in claim order and are logged; lost ones apply nothing, all stale."""
    events = {e: [_event(e, s, 1, "l.x") for s in range(1, n + 1)] for e, n in batch.items()}
    decided = share({e: Progress(1, 0) for e in batch}, events, {}, set(), lambda _: False)
    applies, applied = claimed(decided, won)
    assert set(applies) == set(batch) & won
    assert applied == [e for entity in sorted(batch) if entity in won for e in events[entity]]
    for entity, entity_plan in decided.plans.items():
        if entity in won:
            assert entity_plan.apply == events[entity]
        else:
            assert (entity_plan.apply, entity_plan.stale) == ([], events[entity])


def test_firsts_are_each_entity_s_earliest_version() -> None:
    """The lock creates progress rows from each entity's earliest event of the batch."""
    events = {"a": [_event("a", 3, 1, "l.x"), _event("a", 1, 2, "l.x"), _event("a", 2, 1, "l.x")]}
    assert firsts(events)["a"].version == (1, 2)
