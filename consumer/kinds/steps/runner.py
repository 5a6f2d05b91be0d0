"""A step route in the consumer: apply what is due, park what is early, drain what became due.

Order per poll batch: PostgreSQL (the applies, then a mark of what is about to park),
then Redis (parks, then removal of drained events), and only then may the loop commit
Kafka offsets.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import structlog

from consumer.errors import RoutesError
from consumer.kinds._barrier import apply_guarded, refusal, reset
from consumer.kinds._base import Applier, Conn
from consumer.kinds._connections import lane_connections
from consumer.kinds._outcome import Carried, Outcome, Refusal, merge
from consumer.kinds._resources import Resources
from consumer.kinds.steps import awaited, looped, metrics, statement, traced
from consumer.kinds.steps.apply import apply_alone, apply_read, apply_steps
from consumer.kinds.steps.errors import PARK_CAP_REACHED, STEP_FAILED
from consumer.kinds.steps.guarded import Drained, apply_parked
from consumer.kinds.steps.handlers import Handlers
from consumer.kinds.steps.inflight import InFlight
from consumer.kinds.steps.lanes import Lanes
from consumer.kinds.steps.metrics import tally
from consumer.kinds.steps.parking import NO_MEMORY, ParkingLot, lot_of
from consumer.kinds.steps.plan import Plan
from consumer.kinds.steps.retries import Action
from consumer.kinds.steps.route import StepRoute, resolve
from consumer.kinds.steps.store import StepStore
from consumer.kinds.steps.transaction import pipelined_transaction
from schemas import DecodeError, Event, decode, tracing
from schemas.codec import MAX_MESSAGE_BYTES
from schemas.runtime import postgres
from schemas.runtime.causes import Cause, cause
from schemas.runtime.outages import waited_out

if TYPE_CHECKING:
    from consumer.settings import RouteSettings

log = structlog.get_logger(__name__)

# Parked events fetched per entity and round while draining.
DRAIN_WINDOW = 500
# How long start-up waits for the connections of lanes kept open (``keep_lanes_open``).
OPEN_WAIT_S = 30.0
# Room in the lanes past the poll batch, per lane: entities queued with work running,
# and events queued. Beyond it the batch waits, as it did before lanes carried on.
ENTITIES_PER_LANE = 2
EVENTS_PER_LANE = 32


def _by_entity(events: Sequence[Event]) -> dict[str, list[Event]]:
    grouped: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        grouped[event.entity_id].append(event)
    return dict(grouped)


def _may_wait(entity_plan: Plan) -> bool:
    """Whether Redis may hold parked events of the entity: a park mark ahead of its start."""
    return entity_plan.start is None or entity_plan.start.parked_ahead


def _add(
    outcome: Outcome, plans: Mapping[str, Plan], copies: Mapping[int, bytes] | None = None
) -> None:
    """Count the plans into the outcome; a step given up on to the dead-letter topic.

    ``copies``: each drained event's parked bytes (by ``id``), for a letter without a message.
    """
    counts = tally(outcome)
    for entity_plan in plans.values():
        outcome.applied += entity_plan.apply
        outcome.stale += entity_plan.stale
        counts.stopped += entity_plan.stopped is not None
        for failure in entity_plan.failed:
            event, verdict = failure.event, failure.verdict
            if verdict.action is Action.RETRY:
                counts.retried[event.event_type] += 1
            elif verdict.exhausted:
                counts.exhausted[(event.event_type, str(verdict.action))] += 1
            if verdict.action is Action.DEAD_LETTER:
                copy = None if copies is None else copies.get(id(event))
                outcome.refused.append(Refusal(event, STEP_FAILED, failure.reason, copy))


class StepApplier(Applier[StepRoute]):
    """One step route: its handlers imported at start, its parking lot bound at connect."""

    def __init__(self, route: StepRoute) -> None:
        self.route = route
        # Handlers are imported once; an unimportable one is a start-up error.
        self.store = StepStore(route)
        self.handlers = Handlers(resolve(route))
        self._lot: ParkingLot | None = None
        self._marks_checked = False
        # The largest parked member read back: what the consumer takes, and a trace stamp.
        self._parked_cap = MAX_MESSAGE_BYTES + tracing.STAMP_ROOM
        self._lanes: Lanes | None = None
        # Entities in lanes past their poll batch (only in the consumer's loop).
        self._inflight: InFlight | None = None

    @property
    def lot(self) -> ParkingLot:
        """Where this route parks early events; ``connect`` first."""
        if self._lot is None:
            raise RoutesError(
                [f"route {self.route.stream}: step routes need REDIS_URL for parking"]
            )
        return self._lot

    def connect(self, links: Resources[RouteSettings]) -> None:
        """Check the handlers' statements against the database, bind the parking lot
        (``RoutesError`` when there is no Redis) and the lanes."""
        self._check_statements(links)
        lot = lot_of(links)
        self._parked_cap = links.settings.max_message_bytes + tracing.STAMP_ROOM
        if self._lanes is None:
            self._lanes = self._bind_lanes(links)
            if links.carry and self._lanes.parallel:
                size = self._lanes.size
                on_loop = bool(self.handlers.awaited_types) and self._lanes.looped
                self._inflight = InFlight(
                    self._lanes,
                    self._in_lane,
                    most_entities=size * ENTITIES_PER_LANE,
                    most_events=size * EVENTS_PER_LANE,
                    looped=self._in_lane_looped if on_loop else None,
                )
        lot.check_layout()
        left = lot.legacy(self.route.stream)
        if left:  # moved by the step kind's upgrade, never on the hot path
            log.warning(
                "parks_in_old_layout",
                route=self.route.stream,
                entities=left,
                hint="run inorder-consumer migrate once no 0.1.0 consumer runs: it moves them",
            )
        self._lot = lot

    def _check_statements(self, links: Resources[RouteSettings]) -> None:
        """``RoutesError`` naming each handler whose ``sql`` does not prepare on the
        database (unchecked where the route is connected with none, as a test may be)."""
        statements = {t: h.sql for t, h in self.route.handlers.items() if h.sql}
        if not statements or (links.settings.database_url is None and not links.has_conn):
            return
        wrong = [
            f"route {self.route.stream}: sql of handler {event_type} does not prepare: {why}"
            for event_type, sql in statements.items()
            if (why := statement.check(links.conn, sql)) is not None
        ]
        if wrong:
            raise RoutesError(wrong)

    @property
    def lanes(self) -> Lanes:
        """Where entities whose steps are applied alone go; ``connect`` first."""
        if self._lanes is None:
            raise RoutesError([f"route {self.route.stream}: the route is not connected"])
        return self._lanes

    def _bind_lanes(self, links: Resources[RouteSettings]) -> Lanes:
        """The route's lanes (its own ``lanes``, else the consumer's ``INORDER_STEP_LANES``)."""
        url = links.settings.database_url
        size = self.route.lanes or links.settings.step_lanes
        program = f"inorder-lanes/{self.route.stream}"
        dsn, pool = None, None
        if url is not None:
            dsn = postgres.conninfo(url, program)
            pool = postgres.pool(dsn, program, size) if size > 1 else None
        elif links.has_conn:  # a test kit's connection: the lanes open theirs alike
            dsn = postgres.dsn_of(links.conn)
        if dsn is None and self.handlers.awaited_types:
            raise RoutesError(
                [f"route {self.route.stream}: async def handlers need the consumer's DATABASE_URL"]
            )
        return Lanes(size, pool, dsn=dsn, program=program)

    def connections(self) -> int:
        """The connections the route's lanes may hold at once (two a lane with async def
        handlers); none without lanes of their own."""
        lanes = self._lanes
        if lanes is None or lanes.pool is None:
            return 0
        return lane_connections(lanes.size, awaited=bool(self.handlers.awaited_types))

    def share(self) -> None:
        """An entity's one-by-one steps (external calls) run under its lock from now on."""
        self.store.shared = True

    def ready(self) -> None:
        """With ``keep_lanes_open``, open the lanes' connections and keep them: the threads'
        unless every turn runs on the event loop (every handler ``async def``), and the
        loop's for ``async def`` handlers. Start-up waits for them, up to ``OPEN_WAIT_S``."""
        lanes = self._lanes
        if not self.route.keep_lanes_open or lanes is None:
            return
        awaited = self.handlers.awaited_types
        # The turns run on the loop (as ``connect`` chose) and no handler needs a thread.
        on_loop = self._inflight is not None and bool(awaited) and lanes.looped
        only_awaited = on_loop and awaited == frozenset(self.handlers.functions)
        if not lanes.keep_open(threads=not only_awaited, awaited=bool(awaited), wait_s=OPEN_WAIT_S):
            log.warning(
                "lanes_still_opening",
                route=self.route.stream,
                lanes=lanes.size,
                waited_s=OPEN_WAIT_S,
                hint="the database is slow to start sessions; the rest open in the background",
            )

    def close(self) -> None:
        """Close the lanes' connections (the consumer is stopping; ``collect`` came first)."""
        self._inflight = None
        if self._lanes is not None:
            self._lanes.close()

    def apply(self, conn: Conn, events: Sequence[Event], raw: Mapping[Event, bytes]) -> Outcome:
        """Apply, park and drain; events a full parking set refused come back ``held``.

        Carrying (the consumer's loop), entities applied one by one go to lanes of their
        own and their events come back ``deferred``; so do events of entities still in
        a lane from an earlier batch, which join the entity's queue there.
        """
        outcome = Outcome()
        self._check_marks(conn)
        by_entity = _by_entity(events)
        carrying = self._inflight
        if carrying is not None:
            # Straight to a lane: an entity in one already, and one whose every event here
            # is applied alone (its due steps would be, and its lane parks the rest), so
            # the batch's transaction neither locks nor reads it for nothing.
            for entity in [
                e
                for e, evs in by_entity.items()
                if e in carrying or all(self.handlers.alone(ev) for ev in evs)
            ]:
                self._carry(entity, by_entity.pop(entity), raw, outcome)
        plans, alone = apply_steps(
            conn, self.store, self.handlers, by_entity, self.lanes, defer=carrying is not None
        )
        for entity in alone:
            self._carry(entity, by_entity[entity], raw, outcome)
        self._after(conn, plans, raw, outcome)
        return outcome

    def _carry(
        self, entity: str, events: Sequence[Event], raw: Mapping[Event, bytes], outcome: Outcome
    ) -> None:
        """Give the entity's events to its lane (no events: it drains there)."""
        assert self._inflight is not None
        self._inflight.add(entity, events, raw)
        outcome.deferred += events

    def _after(
        self,
        conn: Conn,
        plans: Mapping[str, Plan],
        raw: Mapping[Event, bytes],
        outcome: Outcome,
        *,
        carry: bool = True,
    ) -> None:
        """Count what the plans applied; park what is early; drain what became due."""
        _add(outcome, plans)
        early = [(p, e) for p in plans.values() for e in p.park]
        if early:  # first in PostgreSQL, so a park Redis loses in a crash can be found
            with pipelined_transaction(conn):
                self.store.mark_parked(conn, [e for _, e in early])
        parking = traced.parked_values(early, [raw[e] for _, e in early])
        sizes = self.lot.park(
            self.route.stream,
            [(e.entity_id, e.seq, value) for _, e, _, value in parking],
            (self.route.max_parked, self.route.max_parked_bytes),
            self.route.park_ttl_s,
        )
        held = {id(e): size for (_, e), size in zip(early, sizes, strict=True) if size < 0}
        counts = tally(outcome)
        counts.parked += [(e, distance) for _, e, distance, _ in parking if id(e) not in held]
        refused = [e for _, e in early if id(e) in held]
        counts.escalated += self._hold(conn, refused)
        outcome.held += [Refusal(e, PARK_CAP_REACHED, _why_held(e, held[id(e)])) for e in refused]
        # Only entities that parked something ahead of where they stood can have parked
        # successors now due (an in-order stream asks Redis nothing). A park another
        # consumer makes meanwhile, or a leftover of a crash, is the sweeper's to drain.
        # Consumers sharing entities park what they find held by another: every entity a
        # run went through may have parks now (the mark was read before they were made).
        shared = self.store.shared
        advanced = self.lot.indexed(
            self.route.stream,
            sorted(e for e, p in plans.items() if shared or (p.apply and _may_wait(p))),
        )
        drain = sorted(set(advanced) | {e.entity_id for _, e in early})
        self._drain(conn, drain, outcome, carry=carry)

    # ------------------------------------------------------------------ lanes past the batch

    def collect(self, wait: float | None = 0.0) -> Carried:
        """What the lanes finished since the last look (``wait``: for all, up to so long).

        Entities an outage stopped are started again first: the loop has waited it out.
        """
        carrying = self._inflight
        if carrying is None:
            return Carried()
        carrying.retry()
        carried = Carried()
        for turn in carrying.finished(wait):
            turn.outcome.released = turn.taken
            carried.outcomes.append(turn.outcome)
            if turn.error is not None:
                if not waited_out(turn.error):
                    raise turn.error
                carried.outage = carried.outage or turn.error
        metrics.LANE_EVENTS.labels(self.route.stream).set(carrying.events)
        metrics.LANE_OLDEST_AGE.labels(self.route.stream).set(carrying.oldest_age())
        return carried

    def _in_lane(
        self, conn: Conn, entity: str, events: list[Event], raw: Mapping[Event, bytes]
    ) -> Outcome:
        """A lane's work: the entity's events one by one, behind the barrier; or drain it."""
        if not events:
            outcome = Outcome()
            self._drain(conn, [entity], outcome, carry=False)
            return outcome
        return apply_guarded(_Alone(self, entity), conn, events, raw)

    async def _in_lane_looped(
        self, entity: str, events: list[Event], raw: Mapping[Event, bytes]
    ) -> Outcome:
        """A lane's work as a coroutine on the lanes' event loop (``looped``): an entity of
        awaited steps read and run there, the rest on a lane's thread."""
        lanes = self.lanes
        if not looped.takes(self.handlers, self.store.shared, events):
            return await lanes.blocking(lambda conn: self._in_lane(conn, entity, events, raw))
        done = Plan()
        try:
            async with lanes.aconnection() as aconn:
                read = await awaited.read_entity(aconn, self.store, self.handlers, events, done)
        except Exception as exc:
            if cause(exc) is not Cause.INPUT:
                raise
            return await lanes.blocking(lambda conn: self._again(conn, entity, events, done, raw))
        then = looped.next_after(read, done)
        if then is looped.Next.AGAIN:
            return await lanes.blocking(lambda conn: self._in_lane(conn, entity, events, raw))
        if then is looped.Next.DONE:
            outcome = Outcome()
            _add(outcome, {entity: done})
            return outcome
        assert read is not None

        def settle(conn: Conn) -> Outcome:
            try:
                if then is looped.Next.ON:
                    apply_read(conn, self.store, self.handlers, lanes, read, done)
            except Exception as exc:
                if cause(exc) is not Cause.INPUT:
                    raise
                reset(conn)
                return self._again(conn, entity, events, done, raw)
            outcome = Outcome()
            self._after(conn, {entity: done}, raw, outcome, carry=False)
            return outcome

        return await lanes.blocking(settle)

    def _again(
        self, conn: Conn, entity: str, events: list[Event], done: Plan, raw: Mapping[Event, bytes]
    ) -> Outcome:
        """What the loop settled before its part raised for its input, counted, and the
        chunk's other events applied from the start behind the barrier (``looped.split``)."""
        settled, rest = looped.split(events, done)
        outcome = Outcome()
        _add(outcome, {entity: settled})
        return merge(outcome, self._in_lane(conn, entity, rest, raw) if rest else Outcome())

    def alone(
        self, conn: Conn, entity: str, events: Sequence[Event], raw: Mapping[Event, bytes]
    ) -> Outcome:
        """Apply one entity's events one step per transaction, then park and drain it."""
        outcome = Outcome()
        plans = {entity: apply_alone(conn, self.store, self.handlers, self.lanes, entity, events)}
        self._after(conn, plans, raw, outcome, carry=False)
        return outcome

    def _check_marks(self, conn: Conn) -> None:
        """Once: mark the parks of releases that parked without marking them first."""
        if self._marks_checked:
            return
        route = self.route.stream
        if not self.lot.marks_complete(route):
            entities = [entity for entity, _, _ in self.lot.sizes(route)]
            for start in range(0, len(entities), DRAIN_WINDOW):
                fetched = self.lot.fetch(
                    route, entities[start : start + DRAIN_WINDOW], self.route.max_parked
                )
                events, _, _ = _decode(fetched, self._parked_cap)
                with conn.transaction():
                    self.store.mark(
                        conn, {e: max(ev.version for ev in evs) for e, evs in events.items()}
                    )
            self.lot.marked(route)
            log.info("park_marks_checked", route=route, parked_entities=len(entities))
        self._marks_checked = True

    def drain(self, conn: Conn, entity_ids: Sequence[str]) -> Outcome:
        """Apply whatever parked events of these entities are due now (after a person acted)."""
        outcome = Outcome()
        self._drain(conn, sorted(entity_ids), outcome)
        return outcome

    def _hold(self, conn: Conn, held: Sequence[Event]) -> list[str]:
        """Hold the entities whose parking set is full; the event type of each newly held."""
        escalated = []
        for event in held:
            with conn.transaction():
                newly = self.store.hold(conn, event.entity_id)
            if newly:
                escalated.append(event.event_type)
                log.error(
                    "entity_held",
                    route=self.route.stream,
                    entity=event.entity_id,
                    seq=event.seq,
                    max_parked=self.route.max_parked,
                )
        return escalated

    def _drain(
        self, conn: Conn, candidates: Sequence[str], outcome: Outcome, *, carry: bool = True
    ) -> None:
        """Apply the candidates' parked events that are due, window by window.

        Carrying, an entity whose due steps go one by one drains in a lane of its own.
        """
        route = self.route.stream
        defer = carry and self._inflight is not None
        while candidates:
            fetched = self.lot.fetch(route, candidates, DRAIN_WINDOW)
            if not fetched:
                return
            events, members, broken = _decode(fetched, self._parked_cap)
            drained = (
                apply_parked(
                    lambda window: apply_steps(
                        conn, self.store, self.handlers, window, self.lanes, defer=defer
                    ),
                    conn,
                    events,
                )
                if events
                else Drained()
            )
            plans = drained.plans
            for entity in drained.alone:
                self._carry(entity, [], {}, outcome)
            _add(outcome, plans, members)
            for event, exc in drained.refused:
                outcome.refused.append(refusal(route, event, exc, members[id(event)]))
            traced.drained(route, ((e, members[id(e)]) for p in plans.values() for e in p.apply))
            done = {
                entity: [
                    members[id(e)]
                    for e in plan.apply + plan.stale + [f.event for f in plan.moved_on]
                ]
                for entity, plan in plans.items()
            }
            for entity, bad in broken.items():
                done.setdefault(entity, []).extend(bad)
            for event, _ in drained.refused:
                done.setdefault(event.entity_id, []).append(members[id(event)])
            self.lot.remove(route, done)
            # Again: a full window may hold more that is due, and an entity that moved on
            # past a failed step has its successors due now. Consumers sharing entities
            # look again after any step: another may have parked one meanwhile.
            shared = self.store.shared
            candidates = [
                e
                for e, p in plans.items()
                if (p.apply and (shared or len(fetched[e]) == DRAIN_WINDOW)) or p.moved_on
            ]


class _Alone(Applier[StepRoute]):
    """One entity's events in its lane, as the barrier sees an applier."""

    def __init__(self, applier: StepApplier, entity: str) -> None:
        self.route = applier.route
        self._applier = applier
        self._entity = entity

    def connect(self, links: Resources[RouteSettings]) -> None:
        """Nothing: the route it applies for is connected."""

    def apply(self, conn: Conn, events: Sequence[Event], raw: Mapping[Event, bytes]) -> Outcome:
        """The entity's events one step per transaction, then its parks and drain."""
        return self._applier.alone(conn, self._entity, events, raw)


def _why_held(event: Event, size: int) -> str:
    """Why an early event could not park: its entity's cap, or Redis out of memory."""
    if size == NO_MEMORY:
        return f"Redis had no memory to park entity {event.entity_id} at seq {event.seq}"
    return f"entity {event.entity_id} has reached its parking cap at seq {event.seq}"


def _decode(
    fetched: Mapping[str, list[bytes]], max_bytes: int
) -> tuple[dict[str, list[Event]], dict[int, bytes], dict[str, list[bytes]]]:
    """Parked members decoded per entity, each event's member, and members that do not decode.

    ``max_bytes``: the consumer's own cap and a stamp's room, so that everything it
    parked reads back.
    """
    events: dict[str, list[Event]] = defaultdict(list)
    members: dict[int, bytes] = {}
    broken: dict[str, list[bytes]] = defaultdict(list)
    for entity, raws in fetched.items():
        for member in raws:
            try:
                event = decode(member, max_bytes=max_bytes)
            except DecodeError as exc:
                log.error(  # noqa: TRY400 - the reason says it all
                    "parked_event_unreadable", entity=entity, reason=exc.detail
                )
                broken[entity].append(member)
                continue
            events[entity].append(event)
            members[id(event)] = member
    return dict(events), members, dict(broken)
