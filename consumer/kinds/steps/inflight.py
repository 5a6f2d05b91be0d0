"""Entities in their lanes past the poll batch: a slow entity holds its lane, not the loop.

In the consumer's loop, an entity whose due steps go one by one is not waited for. Its
events join the entity's queue, a lane applies them in seq order on a connection of
its own, and the loop polls on. Events of an entity already queued join its queue, so
an entity is in one lane at a time and its steps stay in order; it leaves when its
queue is empty. What a lane did comes back through ``finished``, with the events it
took: only then may the loop commit offsets past them.

Work an outage stopped keeps its entity queued (events of later batches still join
it) and runs again at ``retry``, once the loop has waited the outage out. Room is
bounded: ``add`` waits while ``most_entities`` entities are queued with work running,
or ``most_events`` events are queued, as the whole batch used to wait.

Given ``looped`` work (a route with ``async def`` steps), a turn is a coroutine on the
lanes' event loop instead of a thread's task: the same queue, chunks and bookkeeping,
each chunk awaited.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from consumer.kinds._arrivals import Arrivals
from consumer.kinds._base import Conn
from consumer.kinds._outcome import Outcome, merge
from schemas import Event

# Applies one entity's queued events on a lane's connection: (connection, entity,
# events, their values). No events: drain what the entity has parked.
Work = Callable[[Conn, str, list[Event], Mapping[Event, bytes]], Outcome]
# The same as a coroutine on the lanes' event loop, which finds its own connections.
LoopedWork = Callable[[str, list[Event], Mapping[Event, bytes]], Awaitable[Outcome]]


class Submits(Protocol):
    """Where the work runs: ``Lanes`` (a thread per lane, a pooled connection each; or
    coroutines on its event loop)."""

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on a lane."""

    def connection(self) -> AbstractContextManager[Conn]:
        """The lane's connection while ``task`` runs."""

    def spawn(self, turn: Callable[[], Awaitable[None]]) -> None:
        """Run the coroutine ``turn()`` on the lanes' event loop."""


@dataclass(slots=True)
class Finished:
    """One lane's turn with an entity: the events it took, what it did, what stopped it."""

    entity: str
    taken: list[Event] = field(default_factory=list)
    outcome: Outcome = field(default_factory=Outcome)
    error: BaseException | None = None


class InFlight:
    """Each queued entity's events, run by at most one lane at a time."""

    def __init__(
        self,
        lanes: Submits,
        work: Work,
        *,
        most_entities: int,
        most_events: int,
        looped: LoopedWork | None = None,
    ) -> None:
        self._lanes = lanes
        self._work = work
        # Given, every turn runs as a coroutine on the lanes' event loop and applies by it.
        self._work_looped = looped
        self.most_entities = most_entities
        self.most_events = most_events
        self._changed = threading.Condition()
        # Each queued entity's events with their values (for parking) and when they were
        # taken (monotonic clock), oldest first; and when the oldest of the events a lane
        # is applying now was taken.
        self._queues: dict[str, list[tuple[Event, bytes, float]]] = {}
        self._applying: dict[str, float] = {}
        self._running: set[str] = set()
        # Entities to drain once their queued events are applied (or at once, none queued).
        self._drains: set[str] = set()
        self._stalled: set[str] = set()
        self._finished: list[Finished] = []
        self._events = 0

    def __contains__(self, entity: object) -> bool:
        with self._changed:
            return entity in self._queues

    @property
    def entities(self) -> int:
        """Entities queued (running, waiting for a lane, or stopped by an outage)."""
        with self._changed:
            return len(self._queues)

    @property
    def events(self) -> int:
        """Events taken and not yet finished."""
        with self._changed:
            return self._events

    def oldest_age(self) -> float:
        """Seconds since the oldest event not yet finished was taken (0: none)."""
        with self._changed:
            taken = [*self._applying.values(), *(q[0][2] for q in self._queues.values() if q)]
            return max(0.0, time.monotonic() - min(taken)) if taken else 0.0

    def add(self, entity: str, events: Sequence[Event], raw: Mapping[Event, bytes]) -> None:
        """Queue ``events`` behind the entity's; a lane starts on it unless one has it already.

        No events: a lane drains what the entity parked, after whatever is queued before
        (events that join later do not take the drain's place: they may all be stale,
        and apply nothing that would drain). Waits while there is no room.
        """
        with self._changed:
            self._changed.wait_for(lambda: self._room(entity))
            self._events += len(events)
            now = time.monotonic()
            taken = [(e, raw[e], now) for e in events]
            if not events:
                self._drains.add(entity)
            queued = self._queues.get(entity)
            if queued is not None:
                queued.extend(taken)
                return
            self._queues[entity] = taken
            self._running.add(entity)
        self._start(entity)

    def _start(self, entity: str) -> None:
        if self._work_looped is not None:
            self._lanes.spawn(lambda: self._run_looped(entity))
        else:
            self._lanes.submit(lambda: self._run(entity))

    def _room(self, entity: str) -> bool:
        if entity in self._queues:
            return self._events < self.most_events or not self._running
        return len(self._running) < self.most_entities and (
            self._events < self.most_events or not self._running
        )

    def retry(self) -> int:
        """Start again the entities an outage stopped; how many."""
        with self._changed:
            stalled = sorted(self._stalled)
            self._stalled.clear()
            self._running.update(stalled)
        for entity in stalled:
            self._start(entity)
        return len(stalled)

    def finished(self, wait: float | None = 0.0) -> list[Finished]:
        """What lanes finished since the last call; ``wait``: seconds for all to finish (None: no
        limit), else return at once."""
        with self._changed:
            if wait != 0.0:
                self._changed.wait_for(lambda: not self._running, wait)
            done, self._finished = self._finished, []
            return done

    def _run(self, entity: str) -> None:
        """A lane's turn: the entity's queue, chunk by chunk, until it is empty."""
        turn = Finished(entity)
        try:
            with self._lanes.connection() as conn:
                while (chunk := self._next(entity)) is not None:
                    try:
                        events, raw = chunk.events, chunk.raw
                        outcome = self._work(conn, entity, events, raw) if events else Outcome()
                        if chunk.drain:
                            outcome = merge(outcome, self._work(conn, entity, [], {}))
                    except BaseException:
                        self._put_back(entity, chunk)
                        raise
                    self._took(turn, chunk, outcome)
        except Exception as exc:  # noqa: BLE001 - handed to the loop, which decides
            self._stall(turn, exc)
        finally:
            self._end(turn)

    async def _run_looped(self, entity: str) -> None:
        """``_run`` as a coroutine on the lanes' event loop (``work_looped``)."""
        work = self._work_looped
        assert work is not None
        turn = Finished(entity)
        try:
            while (chunk := self._next(entity)) is not None:
                try:
                    events = chunk.events
                    outcome = await work(entity, events, chunk.raw) if events else Outcome()
                    if chunk.drain:
                        outcome = merge(outcome, await work(entity, [], {}))
                except BaseException:
                    self._put_back(entity, chunk)
                    raise
                self._took(turn, chunk, outcome)
        except Exception as exc:  # noqa: BLE001 - handed to the loop, which decides
            self._stall(turn, exc)
        finally:
            self._end(turn)

    def _next(self, entity: str) -> _Chunk | None:
        """What the entity's lane applies next: all it has queued, and whether to drain
        after; None: nothing, and the entity leaves its lane."""
        with self._changed:
            queued = self._queues[entity]
            drain = entity in self._drains
            self._drains.discard(entity)
            if not queued and not drain:
                del self._queues[entity]
                self._running.discard(entity)
                return None
            self._queues[entity] = []
            if queued:
                self._applying[entity] = queued[0][2]
        events = [event for event, _, _ in queued]
        return _Chunk(queued, events, Arrivals((e, value) for e, value, _ in queued), drain)

    def _put_back(self, entity: str, chunk: _Chunk) -> None:
        """A chunk that did not finish, in front of what came meanwhile."""
        with self._changed:
            self._queues[entity] = chunk.queued + self._queues[entity]
            if chunk.drain:
                self._drains.add(entity)
            self._applying.pop(entity, None)

    def _took(self, turn: Finished, chunk: _Chunk, outcome: Outcome) -> None:
        turn.outcome = merge(turn.outcome, outcome)
        turn.taken += chunk.events
        with self._changed:
            self._applying.pop(turn.entity, None)

    def _stall(self, turn: Finished, error: Exception) -> None:
        """The turn stopped on ``error``: the entity stays queued, for ``retry``."""
        turn.error = error
        with self._changed:
            self._running.discard(turn.entity)
            self._stalled.add(turn.entity)

    def _end(self, turn: Finished) -> None:
        with self._changed:
            self._events -= len(turn.taken)
            self._finished.append(turn)
            self._changed.notify_all()


@dataclass(frozen=True, slots=True)
class _Chunk:
    """What a lane took from an entity's queue: as queued, the events, their values, and
    whether to drain the entity after them."""

    queued: list[tuple[Event, bytes, float]]
    events: list[Event]
    raw: Mapping[Event, bytes]
    drain: bool
