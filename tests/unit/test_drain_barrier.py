"""The drain's barrier: a parked event that raises alone is refused, every other one applies."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.pq import TransactionStatus

from consumer.kinds.steps.guarded import Applied, apply_parked
from consumer.kinds.steps.plan import Events, Plan
from schemas import Event
from schemas.errors import OutageError

ENTITIES = ("a", "b", "c", "d", "e")


def _event(entity: str, seq: int) -> Event:
    return Event(
        f"{entity}-{seq}", "ledger.added", "ledger", entity, 1, seq, "2026-12-05T00:00:00Z",
        "2026-12-05T00:00:01Z", {},
    )  # fmt: skip


def _conn() -> Any:
    """A connection as the barrier looks at one: open, no transaction left behind."""
    return SimpleNamespace(
        closed=False, info=SimpleNamespace(transaction_status=TransactionStatus.IDLE)
    )


class _Route:
    """Applies every event it is given unless a poisoned one is among them; keeps the calls."""

    def __init__(self, poisoned: set[tuple[str, int]], error: type[Exception] = ValueError) -> None:
        self.poisoned = poisoned
        self.error = error
        self.applied: list[tuple[str, int]] = []

    def __call__(self, window: Events) -> Applied:
        ordered = {entity: sorted(events, key=lambda e: e.seq) for entity, events in window.items()}
        given = [(e.entity_id, e.seq) for events in ordered.values() for e in events]
        if self.poisoned & set(given):
            raise self.error("a store refused one row")
        self.applied += given
        return {entity: Plan(apply=events) for entity, events in ordered.items()}, []


windows = st.dictionaries(
    st.sampled_from(ENTITIES),
    st.lists(st.integers(1, 12), min_size=1, max_size=8, unique=True),
    min_size=1,
)


@given(windows, st.data())
def test_each_poisoned_event_alone_is_refused_and_every_other_applies_in_order(
    window: dict[str, list[int]], data: st.DataObject
) -> None:
    """Whatever events fail, exactly they are refused; the rest apply once, in order per entity."""
    every = [(entity, seq) for entity, seqs in window.items() for seq in seqs]
    poisoned = set(data.draw(st.lists(st.sampled_from(every), max_size=4)))
    route = _Route(poisoned)
    events = {e: [_event(e, s) for s in seqs] for e, seqs in window.items()}
    drained = apply_parked(route, _conn(), events)
    refused = sorted((e.entity_id, e.seq) for e, _ in drained.refused)
    assert refused == sorted(poisoned)
    assert all(isinstance(exc, ValueError) for _, exc in drained.refused)
    assert sorted(route.applied) == sorted(set(every) - poisoned)
    for entity, plan in drained.plans.items():
        seqs = [e.seq for e in plan.apply]
        assert seqs == [s for s in sorted(window[entity]) if (entity, s) not in poisoned]
        assert [s for en, s in route.applied if en == entity] == seqs


def test_an_outage_in_a_drain_goes_up_untouched() -> None:
    """An outage is not an input's fault: nothing is refused, the error reaches the caller."""
    route = _Route({("a", 1)}, OutageError)
    with pytest.raises(OutageError):
        apply_parked(route, _conn(), {"a": [_event("a", 1), _event("a", 2)]})
    assert route.applied == []


def test_an_entity_named_for_a_lane_is_left_to_it() -> None:
    """An entity the drain gives a lane of its own is not applied here, even past a failure."""
    calls: list[Sequence[str]] = []

    def apply(window: Events) -> Applied:
        calls.append(list(window))
        if len(window["a"]) > 1:
            raise ValueError("a store refused one row")
        return {}, ["a"]

    drained = apply_parked(apply, _conn(), {"a": [_event("a", 1), _event("a", 2)]})
    assert drained.alone == ["a"]
    assert drained.refused == []
    assert len(calls) == 2
