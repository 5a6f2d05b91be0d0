"""One poll batch: decode every message, hand each event to its route, name what is left over.

Pure apart from reading the messages: the routes are a dict built once at start-up
(stream -> applier), so routing is one look-up per event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import Message

from consumer import deadletter
from consumer.deadletter import DeadLetter
from consumer.errors import RoutesError
from consumer.kinds import KINDS, Applier, Arrivals, Kind, Resources, Route, connections_problem
from schemas import DecodeError, Event
from schemas.runtime.causes import Cause, cause
from schemas.runtime.reading import Reading

if TYPE_CHECKING:
    from consumer.settings import RouteSettings


class Routing:
    """The consumer's routes, started: each stream's applier, in the order they apply."""

    def __init__(self, appliers: Sequence[Applier[Any]], kinds: Sequence[Kind] = ()) -> None:
        self.appliers = list(appliers)
        self.by_stream = {s: a for a in appliers for s in a.route.streams}
        # The registry entries of the routes' kinds, each once, in the order they apply.
        self.kinds = list({id(k): k for k in kinds}.values())

    @classmethod
    def start(cls, routes: Sequence[Route], kinds: Mapping[str, Kind] = KINDS) -> Routing:
        """Start every route's applier (handlers imported), in the order the registry applies."""
        order = list(kinds)
        ordered = sorted(routes, key=lambda r: order.index(r.kind))
        return cls([kinds[r.kind].start(r) for r in ordered], [kinds[r.kind] for r in ordered])

    def check(self, resources: Resources[RouteSettings]) -> None:
        """Each kind's settings read and its start-up check run, once per kind (a bad
        setting, Redis that can lose parks: ``StartupError``; no relay: a warning)."""
        for kind in self.kinds:
            if kind.process is not None:
                resources.part(kind.process)
            if kind.check is not None:
                kind.check(resources)

    def connect(self, resources: Resources[RouteSettings]) -> None:
        """Check every route against the database (and bind what else its kind uses), then
        the connections they may hold together against the server's (``RoutesError``);
        only then open what routes keep open from the start."""
        for applier in self.appliers:
            applier.connect(resources)
        held = {a.route.stream: n for a in self.appliers if (n := a.connections())}
        wrong = connections_problem(resources.conn, held) if held else None
        if wrong is not None:
            self.close()
            raise RoutesError([wrong])
        for applier in self.appliers:
            applier.ready()

    def close(self) -> None:
        """Let go of what appliers hold beyond the consumer's connection (a lane pool)."""
        for applier in self.appliers:
            applier.close()

    def split(
        self, events: Sequence[Event]
    ) -> tuple[list[tuple[Applier[Any], list[Event]]], list[Event]]:
        """Each route's share of ``events``, in the order routes apply; and what no route takes."""
        shares: dict[int, list[Event]] = {id(a): [] for a in self.appliers}
        unrouted: list[Event] = []
        for event in events:
            applier = self.by_stream.get(event.entity_type)
            if applier is None:
                unrouted.append(event)
            else:
                shares[id(applier)].append(event)
        return [(a, shares[id(a)]) for a in self.appliers if shares[id(a)]], unrouted


@dataclass(frozen=True, slots=True)
class Prepared:
    """A poll batch decoded and routed: each route's share, and what must be dead-lettered."""

    messages: Sequence[Message]
    shares: list[tuple[Applier[Any], list[Event]]]
    dead: list[DeadLetter]
    # The message each event came in, and its value, for parking: by the event itself,
    # never by a field its producer wrote.
    by_event: Mapping[Event, Message]
    raw: Mapping[Event, bytes]


# About what one JSON node (an object, an array, a member or an element) takes once
# decoded: a small dict is 64 bytes, a small string or int about 50, with its slot.
NODE_BYTES = 64


def weight(message: Message) -> int:
    """About how much memory ``message``'s event takes once decoded: its length, and its nodes.

    Nodes are counted by their brackets and commas (three byte scans in C, cheap next to
    parsing): a megabyte of ``{}`` is 24 times its size as Python objects.
    """
    value = message.value() or b""
    nodes = value.count(b"{") + value.count(b"[") + value.count(b",")
    return len(value) + NODE_BYTES * nodes


def parts(messages: Sequence[Message], budget: int) -> list[list[Message]]:
    """``messages`` in order, in parts whose decoded weight fits ``budget`` (one message alone
    always makes a part)."""
    found: list[list[Message]] = []
    part: list[Message] = []
    used = 0
    for message in messages:
        cost = weight(message)
        if part and used + cost > budget:
            found.append(part)
            part, used = [], 0
        part.append(message)
        used += cost
    if part:
        found.append(part)
    return found


def prepare(messages: Sequence[Message], routing: Routing, reading: Reading) -> Prepared:
    """Decode every message; undecodable ones and those of unrouted streams become dead letters."""
    events: list[Event] = []
    dead: list[DeadLetter] = []
    by_event: Arrivals[Message] = Arrivals()
    raw: Arrivals[bytes] = Arrivals()
    for message in messages:
        try:
            event, envelope = reading.read(message)
        except DecodeError as exc:
            dead.append(DeadLetter(message, exc.reason, exc.detail))
            continue
        except Exception as exc:  # the barrier: what one message raised refuses it alone
            if cause(exc) is not Cause.INPUT:
                raise
            detail = f"{type(exc).__name__}: {str(exc)[:300]}"
            dead.append(DeadLetter(message, deadletter.UNDECODABLE, detail))
            continue
        events.append(event)
        by_event.add(event, message)
        raw.add(event, envelope)
    shares, unrouted = routing.split(events)
    for event in unrouted:
        detail = f"no route for stream {event.entity_type!r}"
        dead.append(DeadLetter(by_event[event], deadletter.UNKNOWN_STREAM, detail, event))
    return Prepared(messages, shares, dead, by_event, raw)
