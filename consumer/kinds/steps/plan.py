"""Ordered steps, the pure decisions: where an entity stands, what applies now, what parks.

``plan`` decides for one entity (apply, park, stale); ``share`` decides for a whole
poll batch's share from the progress rows it locked (what each entity applies, which
runs to claim, which entities go one by one); ``claimed`` turns what the claim found
into the steps to run; ``calls`` orders the function calls that run them. No I/O:
tested exhaustively without services.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from consumer.kinds.steps.retries import Action, Failed
from consumer.kinds.steps.route import Entry
from schemas import Event
from schemas.snapshot import is_snapshot


@dataclass(frozen=True, slots=True)
class Progress:
    """Where an entity stands: the generation and the last seq applied in it.

    ``parked`` is the newest version the entity ever parked (its park mark), when known.
    """

    generation: int
    last_applied: int
    stopped: bool = False
    parked: tuple[int, int] | None = None

    @property
    def parked_ahead(self) -> bool:
        """True when the entity parked something newer than what it has applied."""
        return self.parked is not None and self.parked > (self.generation, self.last_applied)


@dataclass(slots=True)
class Plan:
    """What to do with one entity's events: runs to apply, events to park, stale events."""

    apply: list[Event] = field(default_factory=list)
    park: list[Event] = field(default_factory=list)
    stale: list[Event] = field(default_factory=list)
    start: Progress | None = None
    end: Progress | None = None
    # Why the entity was stopped for a person while this plan was applied (None: it was not).
    stopped: str | None = None
    # Calls of its steps that raised, and what each led to (``retries``).
    failed: list[Failed] = field(default_factory=list)

    @property
    def moved_on(self) -> list[Failed]:
        """Failed steps the entity moved on past (skipped or dead-lettered)."""
        return [f for f in self.failed if f.verdict.action in (Action.SKIP, Action.DEAD_LETTER)]

    def settle(self, failure: Failed) -> None:
        """Take one failure's verdict into the plan: stopped for a person, or moved on.

        An entity that moves on leaves the failed event out of what it parks; those
        after it still park, and the drain that follows applies them.
        """
        self.failed.append(failure)
        action = failure.verdict.action
        if action is Action.STOP:
            self.stopped = failure.reason
        elif action is not Action.RETRY:
            self.park = [e for e in self.park if e.version != failure.event.version]


def plan(progress: Progress, events: Iterable[Event], *, baseline: bool = False) -> Plan:
    """Decide, for one entity, which events apply now (in order), which park, which are stale.

    A newer generation starts over at seq 1; anything of an older generation is stale.
    An entity stopped for a person applies nothing and parks what is newer. A snapshot
    is stale unless the route takes snapshots as a ``baseline``: then one newer than
    where the entity stands applies at once, moving it on to the snapshot's version.
    """
    result = Plan(start=progress)
    generation, last = progress.generation, progress.last_applied
    seen: set[tuple[int, int]] = set()
    marked = sorted(((e, is_snapshot(e)) for e in events), key=lambda m: (m[0].version, m[1]))
    for event, snapshot in marked:  # a snapshot after the change event of its version
        if snapshot:
            if not baseline or event.version <= (generation, last):
                result.stale.append(event)
            elif progress.stopped:
                result.park.append(event)
            else:
                result.apply.append(event)
                generation, last = event.generation, event.seq
            continue
        if event.version in seen or event.generation < generation:
            result.stale.append(event)
            continue
        seen.add(event.version)
        same = event.generation == generation
        if same and event.seq <= last:
            result.stale.append(event)
        elif progress.stopped:
            result.park.append(event)
        elif (same and event.seq == last + 1) or (not same and event.seq == 1):
            result.apply.append(event)
            generation, last = event.generation, event.seq
        else:
            result.park.append(event)
    result.end = Progress(generation, last, progress.stopped)
    return result


def taken(step_plan: Plan, pending: list[Event], done: Plan) -> tuple[Event | None, list[Event]]:
    """The step ``step_plan`` applies first (None: none, and what it parks goes to ``done``),
    and ``pending`` without it and without the stale; the plan's stale and end go to ``done``.

    A lane applies an entity's steps one at a time: it plans, takes the first, drives it
    and plans again from where that step left the entity.
    """
    done.stale += step_plan.stale
    done.end = step_plan.end
    if not step_plan.apply:
        done.park += step_plan.park
        return None, pending
    event = step_plan.apply[0]
    aside = {id(event), *(id(e) for e in step_plan.stale)}
    return event, [e for e in pending if id(e) not in aside]


def copies_apart(events: Iterable[Event], done: Plan) -> list[Event]:
    """``events`` with each version once, in the order they came; the later copies of a
    version delivered twice go to ``done`` as stale (a snapshot may share its version)."""
    pending: list[Event] = []
    seen: set[tuple[int, int, bool]] = set()
    for event in events:
        copy = (*event.version, is_snapshot(event))
        if copy in seen:
            done.stale.append(event)
        else:
            seen.add(copy)
            pending.append(event)
    return pending


Events = Mapping[str, Sequence[Event]]
Claim = tuple[str, Progress, Progress]  # entity, where it stood, where its run leaves it


@dataclass(slots=True)
class Share:
    """A share decided: each entity's plan, the runs to claim, the entities to go one by one."""

    plans: dict[str, Plan] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    one_by_one: set[str] = field(default_factory=set)


def firsts(events: Events) -> dict[str, Event]:
    """Each entity's earliest event (its lock also creates its progress row from it)."""
    return {entity: min(evs, key=lambda e: e.version) for entity, evs in events.items()}


def cut(entity_plan: Plan, limit: tuple[int, int]) -> None:
    """Apply only the steps before ``limit``; park that one and those after it."""
    keep = [e for e in entity_plan.apply if e.version < limit]
    entity_plan.park = [e for e in entity_plan.apply if e.version >= limit] + entity_plan.park
    entity_plan.apply = keep
    entity_plan.end = Progress(keep[-1].generation, keep[-1].seq) if keep else entity_plan.start


def share(
    progress: Mapping[str, Progress],
    events: Events,
    limits: Mapping[str, tuple[int, int]],
    one_by_one: set[str],
    external: Callable[[Event], bool],
    *,
    baseline: bool = False,
) -> Share:
    """Decide a whole share under its locks, in entity order.

    Each entity is planned from its locked progress and cut before its limit. One with
    something to apply claims its run, unless it goes one by one: it did in an earlier
    try (``one_by_one``), or a step it applies calls outside PostgreSQL (``external``).
    """
    decided = Share(one_by_one=set(one_by_one))
    for entity_id in sorted(events):
        entity_plan = plan(progress[entity_id], events[entity_id], baseline=baseline)
        decided.plans[entity_id] = entity_plan
        if entity_id in limits:
            cut(entity_plan, limits[entity_id])
        if entity_id in decided.one_by_one or not entity_plan.apply or entity_plan.end is None:
            continue
        if any(external(e) for e in entity_plan.apply):
            decided.one_by_one.add(entity_id)
            continue
        decided.claims.append((entity_id, progress[entity_id], entity_plan.end))
    return decided


def claimed(decided: Share, won: set[str]) -> tuple[dict[str, list[Event]], list[Event]]:
    """The runs to apply now, by entity, and every step they log, in claim order.

    A claim not won means another consumer applied that run meanwhile: its steps turn
    stale in the entity's plan.
    """
    applies: dict[str, list[Event]] = {}
    applied: list[Event] = []
    for entity_id, _, _ in decided.claims:
        entity_plan = decided.plans[entity_id]
        if entity_id not in won:
            entity_plan.stale += entity_plan.apply
            entity_plan.apply = []
            continue
        applies[entity_id] = entity_plan.apply
        applied += entity_plan.apply
    return applies, applied


def calls(
    applies: Mapping[str, Sequence[Event]], functions: Mapping[str, Entry], *, single: bool
) -> list[tuple[Entry, list[Event]]]:
    """The function calls that apply every entity's due steps, each entity's in seq order.

    An entity's steps are cut into runs: one step each, or consecutive steps of one
    ``many`` function together. Round r calls every entity's r-th run, so no step runs
    before an earlier step of its entity; within a round the runs of one ``many``
    function are joined into one call. ``single`` gives every step its own call (to
    find which one fails). Types without a function make no call.
    """
    runs_per_entity: list[list[tuple[Entry, list[Event]]]] = []
    get = functions.get
    for entity_id in sorted(applies):
        runs: list[tuple[Entry, list[Event]]] = []
        last: Entry | None = None
        join = False
        for event in applies[entity_id]:
            entry = get(event.event_type)
            if entry is None:
                continue
            if join and entry is last:
                runs[-1][1].append(event)
            else:
                runs.append((entry, [event]))
                last, join = entry, entry[0].many and not single
        runs_per_entity.append(runs)
    result: list[tuple[Entry, list[Event]]] = []
    for round_ in range(max((len(r) for r in runs_per_entity), default=0)):
        joined: dict[int, tuple[Entry, list[Event]]] = {}
        for runs in runs_per_entity:
            if round_ < len(runs):
                entry, events = runs[round_]
                if entry[0].many and not single:
                    joined.setdefault(id(entry), (entry, []))[1].extend(events)
                else:
                    result.append((entry, events))
        result += joined.values()
    return result


def reorder_distance(progress: Progress, event: Event) -> int:
    """How far ahead of the next expected seq an early event is (1 = the one after next)."""
    if event.generation != progress.generation:
        return event.seq
    return event.seq - progress.last_applied - 1
