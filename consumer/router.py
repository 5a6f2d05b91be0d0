"""The router: a dict from entity stream to its route, built once at start-up."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from consumer.routes import Route, streams_of
from schemas import Event


@dataclass(frozen=True, slots=True)
class Routed:
    """A poll batch's decoded events grouped by route, and those no route wants."""

    by_stream: dict[str, list[Event]] = field(default_factory=dict)
    unrouted: list[int] = field(default_factory=list)


class Router:
    """Looks up each event's route by its entity_type."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = {stream: route for route in routes for stream in streams_of(route)}

    def split(self, events: Sequence[Event | None]) -> Routed:
        """Group events by stream; the indexes of events with no route go to ``unrouted``.

        ``None`` entries (messages that did not decode) are skipped.
        """
        by_stream: dict[str, list[Event]] = defaultdict(list)
        unrouted: list[int] = []
        for index, event in enumerate(events):
            if event is None:
                continue
            if event.entity_type in self.routes:
                by_stream[event.entity_type].append(event)
            else:
                unrouted.append(index)
        return Routed(dict(by_stream), unrouted)
