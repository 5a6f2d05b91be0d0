"""Pure projection decisions: newest per entity, records, dead-letter copies, offsets to commit."""

from __future__ import annotations

from itertools import permutations
from typing import Any

from consumer.deadletter import DeadLetter, letter
from consumer.kinds.projection import ProjectionRoute, field_value, newest_per_entity, record
from consumer.loop.classic import next_offsets
from schemas import Event, headers
from tests.support.messages import StandIn


def _event(entity: str, generation: int, seq: int, **payload: Any) -> Event:
    return Event(
        f"{entity}:{generation}:{seq}", "s.x", "s", entity, generation, seq, "t", "t", payload
    )


def test_newest_per_entity_is_order_independent() -> None:
    """In any order, the newest (generation, seq) of each entity is kept; the rest superseded."""
    events = [
        _event("a", 1, 3),
        _event("a", 1, 9),
        _event("a", 2, 1),
        _event("b", 1, 4),
        _event("a", 2, 1),
    ]
    for order in permutations(events):
        newest, superseded = newest_per_entity(list(order))
        assert sorted(e.version for e in newest if e.entity_id == "a") == [(2, 1)]
        assert sorted(e.version for e in newest if e.entity_id == "b") == [(1, 4)]
        assert len(superseded) == 3


def test_field_values_follow_dotted_paths() -> None:
    """Nested payload fields are found by path; a missing one is None."""
    payload = {"a": {"b": 5}, "c": [1]}
    assert field_value(payload, ("a", "b")) == 5
    assert field_value(payload, ("a", "x")) is None
    assert field_value(payload, ("c", "d")) is None


def test_record_lists_key_version_and_columns_in_statement_order() -> None:
    """A record holds entity id, (entity type), generation, seq, then each mapped column."""
    route = ProjectionRoute("s", "t", "id", {"plan": ("plan",)}, entity_type_column="kind")
    assert record(route, _event("a", 2, 7, plan="pro")) == {
        "f0": "a",
        "f1": "s",
        "f2": 2,
        "f3": 7,
        "f4": "pro",
    }


def test_dead_letter_copy_keeps_original_and_says_why() -> None:
    """The copy keeps key, value and headers and adds reason, detail and origin."""
    key, value, hdrs = letter(DeadLetter(StandIn(b"{", 41), "not_json", "bad"), 1024)  # type: ignore[arg-type]
    assert (key, value) == (b"k", b"{")
    assert hdrs[:6] == [
        ("trace", b"1"),
        (headers.DLQ_REASON, "not_json"),
        (headers.DLQ_DETAIL, "bad"),
        (headers.DLQ_TOPIC, "events"),
        (headers.DLQ_PARTITION, "0"),
        (headers.DLQ_OFFSET, "41"),
    ]


def test_oversized_dead_letter_is_cut_and_marked() -> None:
    """A value over the cap is cut to it, with the original length in a header."""
    _, value, hdrs = letter(DeadLetter(StandIn(b"x" * 5000, 1), "too_large", ""), 1024)  # type: ignore[arg-type]
    assert value == b"x" * 1024
    assert (headers.DLQ_TRUNCATED_FROM, "5000") in hdrs


def test_offsets_to_commit_are_last_plus_one_per_partition() -> None:
    """The commit for a batch is each partition's highest offset plus one."""
    batch = [StandIn(b"", 5, 0), StandIn(b"", 9, 1), StandIn(b"", 7, 0)]
    assert [(tp.partition, tp.offset) for tp in next_offsets(batch)] == [(0, 8), (1, 10)]  # type: ignore[arg-type]
