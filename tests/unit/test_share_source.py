"""The share source's bookkeeping: what it accepts, what it hands back, and what it letters.

The client here records what it is told (acknowledgements, polls); the share group
itself is exercised against the broker in the fault suite (tests/faults/test_share.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType

from consumer import metrics
from consumer.loop.share import ShareGroup
from consumer.loop.share_group import GroupTerms, read_terms
from consumer.settings import ConsumerSettings
from schemas.runtime.health import Health


class Record:
    """What the source reads of a record."""

    def __init__(self, offset: int, deliveries: int = 1) -> None:
        self._offset = offset
        self._deliveries = deliveries

    def topic(self) -> str:
        return "events"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def delivery_count(self) -> int:
        return self._deliveries

    def error(self) -> None:
        return None


class Client:
    """Remembers every acknowledgement; hands out the records it is given, once."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.acks: list[tuple[int, AcknowledgeType]] = []
        self.subscribed = True

    def poll(self, _timeout: float) -> list[Record]:
        given, self.records = self.records, []
        return given

    def acknowledge(self, record: Record, kind: AcknowledgeType) -> None:
        self.acks.append((record.offset(), kind))

    def commit_async(self) -> None:
        pass

    def unsubscribe(self) -> None:
        self.subscribed = False

    def subscribe(self, _topics: list[str]) -> None:
        self.subscribed = True


def _source(
    records: list[Record], lettered: Sequence[int] | None = None
) -> tuple[ShareGroup, Client, list[list[int]]]:
    settings = ConsumerSettings.model_construct(
        group_id="g", share_lock_margin_ms=2000, share_max_poll_records=10, poll_max_messages=10
    )
    asked: list[list[int]] = []

    def letter(messages: Sequence[Any]) -> list[Any]:
        asked.append([m.offset() for m in messages])
        return [m for m in messages if lettered is None or m.offset() in lettered]

    source = ShareGroup(settings, ["events"], Health(), letter=letter)
    client = Client(records)
    source._consumer = client  # type: ignore[assignment]
    source._subscribed = True
    source.terms = GroupTerms(lock_s=9.0, delivery_limit=3)
    return source, client, asked


def _expire_all(source: ShareGroup) -> None:
    for entry in source._in_hand.values():
        entry.acquired -= 3600
    source.tick()


def test_done_records_are_accepted_and_held_ones_only_when_released() -> None:
    """ACCEPT only once the effect is durable: a carried record waits for its release."""
    source, client, _ = _source([Record(1), Record(2)])
    first, second = source.take(10, 0.0, 0.0)
    source.hold(second)
    source.done([first, second])
    assert client.acks == [(1, AcknowledgeType.ACCEPT)]
    assert source.take(10, 0.0, 0.0) == []  # nothing new while one is in hand
    source.release(second)
    assert client.acks[-1] == (2, AcknowledgeType.ACCEPT)
    assert not source.ours(second)


def test_records_near_their_lock_end_are_released_for_another_member() -> None:
    """A record not done before lock minus margin goes back (RELEASE), and is no longer ours."""
    before = metrics.SHARE_RELEASED.labels("lock")._value.get()
    source, client, asked = _source([Record(5), Record(6, deliveries=2)])
    taken = source.take(10, 0.0, 0.0)
    _expire_all(source)
    assert sorted(client.acks) == [(5, AcknowledgeType.RELEASE), (6, AcknowledgeType.RELEASE)]
    assert asked == []  # neither on its last delivery
    assert not any(source.ours(m) for m in taken)
    assert metrics.SHARE_RELEASED.labels("lock")._value.get() == before + 2


@pytest.mark.parametrize("lettered", [True, False])
def test_a_last_delivery_is_lettered_before_it_could_be_archived(lettered: bool) -> None:
    """On its last delivery a record is lettered, and accepted only if the letter is in Kafka."""
    unlettered = metrics.SHARE_UNLETTERED._value.get()
    source, client, asked = _source([Record(7, deliveries=3)], lettered=[7] if lettered else [])
    source.take(10, 0.0, 0.0)
    _expire_all(source)
    assert asked == [[7]]
    kind = AcknowledgeType.ACCEPT if lettered else AcknowledgeType.RELEASE
    assert client.acks == [(7, kind)]
    assert metrics.SHARE_UNLETTERED._value.get() == unlettered + (0 if lettered else 1)


def test_an_outage_stops_acquiring_once_nothing_is_in_hand() -> None:
    """Paused: the member leaves the subscription after handing back, and joins on resume."""
    source, client, _ = _source([Record(8)])
    source.take(10, 0.0, 0.0)
    source.pause()
    source.idle(0.0)
    assert client.subscribed  # still holding the record: its lock has time left
    for entry in source._in_hand.values():
        entry.acquired -= 3600
    source.idle(0.0)
    assert client.acks == [(8, AcknowledgeType.RELEASE)]
    assert not client.subscribed
    client.records = [Record(9)]
    assert source.take(10, 0.0, 0.0) == []  # paused: nothing new
    source.resume()
    assert [m.offset() for m in source.take(10, 0.0, 0.0)] == [9]
    assert client.subscribed


def test_group_terms_are_read_with_kafkas_defaults_where_absent() -> None:
    """An unreadable or missing value falls back to 30 s and five deliveries."""
    assert read_terms({}) == GroupTerms(30.0, 5, "latest")
    terms = read_terms(
        {
            "share.record.lock.duration.ms": "8000",
            "share.delivery.count.limit": "x",
            "share.auto.offset.reset": "earliest",
        }
    )
    assert terms == GroupTerms(8.0, 5, "earliest")
