"""Dead letters, the pure part: tooling's header names, what a replay sends and refuses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.admin.replay import (
    MOST_REPLAYS,
    Decision,
    Letter,
    Source,
    Status,
    choose,
    is_copy_of,
    replayed_headers,
)
from consumer.deadletter import DeadLetter, Unsent, letter, replays_of
from schemas import Event, encode, headers
from tests.support.messages import StandIn
from tests.unit.test_batch_contract import _check_values, _checks

EVENT = Event("e:1", "ledger.added", "ledger", "a", 1, 3, "t", "t", {})


def _letter(**changes: object) -> Letter:
    fields: dict[str, object] = {
        "id": 7,
        "entity_type": "ledger",
        "entity_id": "a",
        "generation": 1,
        "seq": 3,
        "event_id": "e:1",
        "reason": "unknown_stream",
        "topic": "events",
        "letter_topic": "dlq",
        "letter_partition": 0,
        "letter_offset": 12,
        "cut": False,
        "replays": 0,
    }
    return Letter(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_letter_carries_the_names_kafka_connect_and_spring_read() -> None:
    """Origin and reason also go under __connect.errors.* and kafka_dlt-* (binary numbers)."""
    _, _, found = letter(DeadLetter(StandIn(b"{}", 41, 2), "not_json", "bad"), 1024)  # type: ignore[arg-type]
    named = dict(found)
    assert named[headers.CONNECT_TOPIC] == "events"
    assert (named[headers.CONNECT_PARTITION], named[headers.CONNECT_OFFSET]) == ("2", "41")
    assert (named[headers.CONNECT_EXCEPTION], named[headers.CONNECT_MESSAGE]) == ("not_json", "bad")
    assert named[headers.SPRING_PARTITION] == (2).to_bytes(4, "big")
    assert named[headers.SPRING_OFFSET] == (41).to_bytes(8, "big")
    assert named[headers.SPRING_EXCEPTION] == "not_json"


def test_a_letter_of_a_drained_event_names_no_place_it_does_not_know() -> None:
    """A drained event's letter knows no topic or offset: tooling's names get the reason only."""
    _, value, found = letter(DeadLetter(Unsent.of(EVENT, b"{parked}"), "step_failed", "x"), 1024)
    names = {k for k, _ in found}
    assert value == b"{parked}"
    assert headers.CONNECT_EXCEPTION in names
    assert not names & {headers.CONNECT_TOPIC, headers.SPRING_OFFSET, headers.SPRING_PARTITION}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    headers.DLQ_REASON,
                    headers.CONNECT_OFFSET,
                    headers.SPRING_TOPIC,
                    headers.REPLAYS,
                    "traceparent",
                    "ce_id",
                    "inorder-event-type",
                ]
            ),
            st.binary(max_size=4),
        )
    ),
    st.integers(0, MOST_REPLAYS),
)
def test_a_replayed_event_keeps_its_own_headers_and_counts_one_more_replay(
    pairs: list[tuple[str, bytes]], replays: int
) -> None:
    """Dead-lettering's headers go, the event's own stay in order, and the count is set once."""
    out = replayed_headers(pairs, replays)
    assert out[:-1] == [
        (k, v) for k, v in pairs if k in {"traceparent", "ce_id", "inorder-event-type"}
    ]
    assert out[-1] == (headers.REPLAYS, str(replays + 1))


def test_the_replay_count_is_read_from_the_original_s_header() -> None:
    """A message replayed twice says so; a missing or garbled count is zero."""

    class Replayed(StandIn):
        def __init__(self, value: bytes | None) -> None:
            super().__init__(b"{}")
            self._count = value

        def headers(self) -> list[tuple[str, bytes | None]]:  # type: ignore[override]
            return [(headers.REPLAYS, self._count)]

    assert replays_of(Replayed(b"2")) == 2  # type: ignore[arg-type]
    assert replays_of(Replayed(b"-1")) == 0  # type: ignore[arg-type]
    assert replays_of(Replayed(b"9" * 40)) == 0  # type: ignore[arg-type]
    assert replays_of(Replayed(None)) == 0  # type: ignore[arg-type]
    assert replays_of(StandIn(b"{}")) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "from_outbox", "refused"),
    [
        ({}, False, None),
        ({}, True, None),
        ({"cut": True}, False, "cut to size"),
        ({"cut": True}, True, None),
        ({"letter_offset": None}, False, "was not recorded"),
        ({"letter_offset": None}, True, None),
        ({"replays": MOST_REPLAYS}, True, "replayed 3 times"),
        ({"replays": MOST_REPLAYS - 1}, False, None),
    ],
)
def test_a_replay_sends_what_it_can_and_says_why_not_for_the_rest(
    changes: dict[str, object], from_outbox: bool, refused: str | None
) -> None:
    """Copies cut or never placed need the outbox; a letter replayed 3 times is not sent again."""
    [chosen] = choose([_letter(**changes)], from_outbox=from_outbox)
    assert chosen.source is (Source.OUTBOX if from_outbox else Source.COPY)
    if refused is None:
        assert chosen.refused is None
    else:
        assert chosen.refused is not None
        assert refused in chosen.refused


def test_every_status_and_decision_is_its_table_s_check() -> None:
    """The migrations' CHECKs on the letters' status and decisions allow exactly the enums."""
    assert frozenset(Status) in {frozenset(v) for v in _checks("status")}
    assert _check_values("decision") == set(Decision)
    assert _check_values("source") == set(Source)


def test_only_dead_lettering_s_headers_are_about_a_letter() -> None:
    """inorder's, Kafka Connect's and Spring's letter headers are; an event's own are not."""
    assert all(
        headers.about_a_letter(h)
        for h in (headers.DLQ_REASON, headers.CONNECT_TOPIC, headers.SPRING_OFFSET)
    )
    assert not any(headers.about_a_letter(h) for h in ("traceparent", "ce_id", headers.REPLAYS))


WHEN = "2026-12-05T10:00:00Z"
SENT = Event("e:1", "ledger.added", "ledger", "a", 1, 3, WHEN, WHEN, {})


def _copy_headers(topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    return [
        (headers.DLQ_TOPIC, topic.encode()),
        (headers.DLQ_PARTITION, str(partition).encode()),
        (headers.DLQ_OFFSET, str(offset).encode()),
    ]


@pytest.mark.parametrize(
    ("changes", "pairs", "value", "mine"),
    [
        ({"kafka_partition": 2, "kafka_offset": 41}, _copy_headers("events", 2, 41), b"x", True),
        ({"kafka_partition": 2, "kafka_offset": 41}, _copy_headers("events", 2, 40), b"x", False),
        ({"kafka_partition": 2, "kafka_offset": 41}, _copy_headers("other", 2, 41), b"x", False),
        ({"kafka_partition": 2, "kafka_offset": 41}, [], encode(SENT), False),
        ({}, [], encode(SENT), True),
        ({"event_id": "e:2"}, [], encode(SENT), False),
        ({}, [], b"not json", False),
    ],
)
def test_only_a_letters_own_copy_is_taken_for_it(
    changes: dict[str, object], pairs: list[tuple[str, bytes]], value: bytes, mine: bool
) -> None:
    """The copy names its original's place; without one, its event id must be the letter's."""
    assert is_copy_of(_letter(**changes), pairs, value) is mine
