"""The pure call schedule of a batch's steps: every step once, each entity's in seq order."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from consumer.kinds.steps import Handler
from consumer.kinds.steps.plan import calls
from consumer.kinds.steps.route import Entry
from schemas import Event


def _nothing(conn: Any, event: Any) -> None:
    """A step function that is never called here."""


FUNCTIONS: dict[str, Entry] = {
    "l.one": (Handler("m:one"), _nothing),
    "l.many": (Handler("m:many", many=True), _nothing),
    "l.other_many": (Handler("m:other_many", many=True), _nothing),
}
TYPES = [*FUNCTIONS, "l.ignored"]


def _event(entity: str, seq: int, event_type: str) -> Event:
    return Event(f"{entity}:{seq}", event_type, "l", entity, 1, seq, "t", "t", {})


batches = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]),
    st.lists(st.sampled_from(TYPES), min_size=1, max_size=12),
    min_size=1,
).map(
    lambda spec: {
        entity: [_event(entity, seq, t) for seq, t in enumerate(types, start=1)]
        for entity, types in spec.items()
    }
)


@given(batches, st.booleans())
def test_every_step_is_called_once_in_its_entitys_order(
    applies: dict[str, list[Event]], single: bool
) -> None:
    """Any mix of one-step and many functions: each step once, per entity in seq order."""
    seen: dict[str, list[int]] = defaultdict(list)
    for (handler, _), events in calls(applies, FUNCTIONS, single=single):
        assert events
        assert all(FUNCTIONS[e.event_type][0] is handler for e in events)
        assert len(events) == 1 or (handler.many and not single)
        for event in events:
            seen[event.entity_id].append(event.seq)
    for entity, events in applies.items():
        wanted = [e.seq for e in events if e.event_type in FUNCTIONS]
        assert seen.get(entity, []) == wanted


def test_many_steps_of_many_entities_are_one_call() -> None:
    """Consecutive steps of one many function, across entities, are joined into one call."""
    applies = {e: [_event(e, s, "l.many") for s in (1, 2, 3)] for e in ("a", "b")}
    [(entry, events)] = calls(applies, FUNCTIONS, single=False)
    assert entry[0].many
    assert [(e.entity_id, e.seq) for e in events] == [
        ("a", 1),
        ("a", 2),
        ("a", 3),
        ("b", 1),
        ("b", 2),
        ("b", 3),
    ]
    assert len(calls(applies, FUNCTIONS, single=True)) == 6


def test_a_step_of_another_function_splits_the_run() -> None:
    """many, one, many for one entity are three calls in that order."""
    applies = {"a": [_event("a", 1, "l.many"), _event("a", 2, "l.one"), _event("a", 3, "l.many")]}
    assert [
        (h.function, [e.seq for e in evs])
        for (h, _), evs in calls(applies, FUNCTIONS, single=False)
    ] == [("m:many", [1]), ("m:one", [2]), ("m:many", [3])]
