"""What the loop knows of each event of a poll batch, found by the event itself.

Nothing a producer writes says where an event came from: event ids are unique per
source only (two outboxes may share a topic, a buggy producer may repeat one), and
two messages may carry equal events. So the loop keys what it keeps per event (its
message, its bytes) by the decoded ``Event`` object, one per message taken: two
messages are two keys whatever they hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

from schemas import Event

V = TypeVar("V")


class Arrivals(Mapping[Event, V]):
    """A value for each event object of a poll batch (its message, its bytes)."""

    __slots__ = ("_items",)

    def __init__(self, pairs: Iterable[tuple[Event, V]] = ()) -> None:
        # By identity: the event is kept beside its value, so its id is never reused.
        self._items: dict[int, tuple[Event, V]] = {id(e): (e, v) for e, v in pairs}

    def __getitem__(self, event: Event) -> V:
        return self._items[id(event)][1]

    def __contains__(self, event: object) -> bool:
        return id(event) in self._items

    def __iter__(self) -> Iterator[Event]:
        return (event for event, _ in self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def add(self, event: Event, value: V) -> None:
        """Keep ``value`` for ``event``."""
        self._items[id(event)] = (event, value)

    def pop(self, event: Event) -> V | None:
        """The value kept for ``event``, no longer kept; None when there was none."""
        found = self._items.pop(id(event), None)
        return None if found is None else found[1]
