"""Entities in lanes past the poll batch: one lane per entity at a time, in order, none lost."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.kinds import Arrivals, Outcome
from consumer.kinds.steps.inflight import InFlight
from schemas import Event

WHEN = "2026-12-03T10:00:00Z"


def _event(entity: str, seq: int, copy: int = 0) -> Event:
    return Event(
        f"{entity}:{seq}:{copy}", "ledger.mailed", "ledger", entity, 1, seq, WHEN, WHEN, {}
    )


class _Lanes:
    """Threads standing in for ``Lanes``: a task per submit, a dummy connection each; and
    one event loop on a thread of its own, ``size`` coroutine turns on it at once."""

    def __init__(self, size: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=size)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._room = asyncio.Semaphore(size)

    def submit(self, task: Callable[[], None]) -> None:
        self.pool.submit(task)

    @contextmanager
    def connection(self) -> Iterator[Any]:
        yield object()

    def spawn(self, turn: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            async with self._room:
                await turn()

        asyncio.run_coroutine_threadsafe(run(), self.loop)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class _Log:
    """What the work saw: each entity's events in the order applied, and overlaps."""

    def __init__(self, lose: set[str]) -> None:
        self.lock = threading.Lock()
        self.active: set[str] = set()
        self.applied: dict[str, list[str]] = {}
        self.overlaps = 0
        self.lose = set(lose)  # entities whose next work loses the database once
        self.drains: list[str] = []

    def work(
        self, _conn: Any, entity: str, events: list[Event], _raw: Mapping[Event, bytes]
    ) -> Outcome:
        self._enter(entity)
        try:
            time.sleep(0.0005 * len(events))
            return self._applied(entity, events)
        finally:
            self._leave(entity)

    async def work_looped(
        self, entity: str, events: list[Event], _raw: Mapping[Event, bytes]
    ) -> Outcome:
        """``work`` as a coroutine: other turns run on the loop while it waits."""
        self._enter(entity)
        try:
            await asyncio.sleep(0.0005 * len(events))
            return self._applied(entity, events)
        finally:
            self._leave(entity)

    def _enter(self, entity: str) -> None:
        with self.lock:
            self.overlaps += entity in self.active
            self.active.add(entity)

    def _applied(self, entity: str, events: list[Event]) -> Outcome:
        with self.lock:
            if entity in self.lose:
                self.lose.discard(entity)
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            if not events:
                self.drains.append(entity)
            self.applied.setdefault(entity, []).extend(e.event_id for e in events)
        return Outcome(applied=list(events))

    def _leave(self, entity: str) -> None:
        with self.lock:
            self.active.discard(entity)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_each_entity_in_one_lane_at_a_time_its_events_in_arrival_order_each_taken_once(
    data: st.DataObject,
) -> None:
    """Any batches, repeats, lanes, room and outages, turns on threads or coroutines on one
    loop: each entity's events once, as they arrived."""
    entities = [f"e{i}" for i in range(data.draw(st.integers(1, 6)))]
    arrivals = data.draw(
        st.lists(st.tuples(st.sampled_from(entities), st.integers(1, 4)), min_size=1, max_size=40)
    )
    events = [_event(entity, seq, copy) for copy, (entity, seq) in enumerate(arrivals)]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(events)), max_size=5)))
    lose = set(data.draw(st.lists(st.sampled_from(entities), max_size=2)))
    log = _Log(lose)
    lanes = _Lanes(data.draw(st.integers(1, 4)))
    inflight = InFlight(
        lanes,
        log.work,
        most_entities=data.draw(st.integers(1, 4)),
        most_events=data.draw(st.integers(1, 8)),
        looped=log.work_looped if data.draw(st.booleans()) else None,
    )
    taken: list[str] = []
    failures = 0

    def collect(wait: float | None) -> None:
        nonlocal failures
        inflight.retry()
        for turn in inflight.finished(wait):
            taken.extend(e.event_id for e in turn.taken)
            assert [e.event_id for e in turn.outcome.applied] == [e.event_id for e in turn.taken]
            failures += turn.error is not None

    for start, end in zip([0, *cuts], [*cuts, len(events)], strict=True):
        batch: dict[str, list[Event]] = {}
        for event in events[start:end]:
            batch.setdefault(event.entity_id, []).append(event)
        for entity, of_entity in batch.items():
            inflight.add(entity, of_entity, Arrivals((e, b"") for e in of_entity))
        collect(0.0)
    while inflight.entities:
        collect(None)
    lanes.shutdown()
    assert log.overlaps == 0
    assert failures == len(lose & {e.entity_id for e in events})
    assert sorted(taken) == sorted(e.event_id for e in events)
    for entity in entities:
        assert log.applied.get(entity, []) == [e.event_id for e in events if e.entity_id == entity]
    assert inflight.events == 0


@pytest.fixture(params=["threads", "looped"])
def looped(request: pytest.FixtureRequest) -> bool:
    """Turns as tasks on threads, or as coroutines on one event loop."""
    return bool(request.param == "looped")


def _inflight(lanes: Any, log: _Log, looped: bool, **room: int) -> InFlight:
    return InFlight(lanes, log.work, looped=log.work_looped if looped else None, **room)


def test_an_entity_added_without_events_is_drained_in_its_lane(looped: bool) -> None:
    """No events: the lane runs the work once with none (to drain what the entity parked)."""
    log = _Log(set())
    lanes = _Lanes(2)
    inflight = _inflight(lanes, log, looped, most_entities=2, most_events=4)
    inflight.add("p", [], {})
    turns = inflight.finished(None)
    lanes.shutdown()
    assert (log.drains, [t.entity for t in turns], inflight.entities) == (["p"], ["p"], 0)


class _Held:
    """Lanes whose tasks wait until ``go`` is called, so events can join a queue first."""

    def __init__(self) -> None:
        self.tasks: list[Callable[[], None]] = []

    def submit(self, task: Callable[[], None]) -> None:
        self.tasks.append(task)

    def spawn(self, turn: Callable[[], Awaitable[None]]) -> None:
        self.tasks.append(lambda: asyncio.run(turn()))

    @contextmanager
    def connection(self) -> Iterator[Any]:
        yield object()

    def go(self) -> None:
        for task in self.tasks:
            task()


def test_a_drain_asked_for_still_happens_when_events_join_the_queue_first(looped: bool) -> None:
    """A drain-only turn, then (stale) events before the lane starts: applied, then drained."""
    log = _Log(set())
    lanes = _Held()
    inflight = _inflight(lanes, log, looped, most_entities=2, most_events=8)
    again = _event("p", 1, copy=1)
    inflight.add("p", [], {})
    inflight.add("p", [again], Arrivals([(again, b"")]))
    lanes.go()
    [turn] = inflight.finished(None)
    assert (log.applied["p"], log.drains, [e.seq for e in turn.taken]) == (
        [again.event_id],
        ["p"],
        [1],
    )
    assert inflight.entities == 0


def test_an_outage_keeps_the_entity_queued_and_later_events_behind_until_retry(
    looped: bool,
) -> None:
    """Work that lost the database stays queued; events that come meanwhile wait behind it."""
    log = _Log({"a"})
    lanes = _Lanes(2)
    inflight = _inflight(lanes, log, looped, most_entities=2, most_events=8)
    first, second = _event("a", 1), _event("a", 2)
    inflight.add("a", [first], Arrivals([(first, b"")]))
    [turn] = inflight.finished(None)
    assert isinstance(turn.error, psycopg.OperationalError)
    assert (turn.taken, "a" in inflight, inflight.events) == ([], True, 1)
    inflight.add("a", [second], Arrivals([(second, b"")]))  # queued behind, no lane yet
    assert inflight.finished(None) == []
    assert inflight.retry() == 1
    [turn] = inflight.finished(None)
    lanes.shutdown()
    assert [e.seq for e in turn.taken] == [1, 2]
    assert (log.applied["a"], inflight.entities, inflight.events) == (
        [first.event_id, second.event_id],
        0,
        0,
    )


def test_the_oldest_age_counts_from_when_the_oldest_unfinished_event_was_taken() -> None:
    """The age grows while a lane holds an event, restarts with what queued, and is 0 when done."""
    release = threading.Event()
    log = _Log(set())

    def work(conn: Any, entity: str, events: list[Event], raw: Mapping[Event, bytes]) -> Outcome:
        if events[0].seq == 1:
            release.wait(5)
        return log.work(conn, entity, events, raw)

    lanes = _Lanes(2)
    inflight = InFlight(lanes, work, most_entities=2, most_events=8)
    assert inflight.oldest_age() == 0.0
    first, second = _event("a", 1), _event("a", 2)
    inflight.add("a", [first], Arrivals([(first, b"")]))
    time.sleep(0.2)
    inflight.add("a", [second], Arrivals([(second, b"")]))
    assert inflight.oldest_age() >= 0.2  # the first event's, not the newer one's
    release.set()
    inflight.finished(None)
    lanes.shutdown()
    assert (inflight.oldest_age(), log.applied["a"]) == (0.0, [first.event_id, second.event_id])
