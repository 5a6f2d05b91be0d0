"""Ordered steps: each event's function runs once, in (generation, seq) order, per entity.

``plan`` is the pure decision for one entity (apply, park, stale); ``StepStore``
runs a batch of plans in one PostgreSQL transaction. Progress rows are locked in
entity order first, so two consumers racing on an entity take turns, and each run
of steps is claimed with a conditional update: zero rows means someone else
applied it, and nothing runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg
import structlog

from consumer.errors import RoutesError
from consumer.routes import Handler, StepRoute
from schemas import Event

log = structlog.get_logger(__name__)
Conn = psycopg.Connection[Any]
# fn(conn, event), or fn(conn, events) for a handler declared ``many``.
StepFunction = Callable[[Conn, Any], None]
Entry = tuple[Handler, StepFunction]


# ---------------------------------------------------------------- pure decisions


@dataclass(frozen=True, slots=True)
class Progress:
    """Where an entity stands: the generation and the last seq applied in it."""

    generation: int
    last_applied: int
    stopped: bool = False


@dataclass(slots=True)
class Plan:
    """What to do with one entity's events: runs to apply, events to park, stale events."""

    apply: list[Event] = field(default_factory=list)
    park: list[Event] = field(default_factory=list)
    stale: list[Event] = field(default_factory=list)
    start: Progress | None = None
    end: Progress | None = None


def plan(progress: Progress, events: Iterable[Event]) -> Plan:
    """Decide, for one entity, which events apply now (in order), which park, which are stale.

    A newer generation starts over at seq 1; anything of an older generation is stale.
    An entity stopped for a person applies nothing and parks what is newer.
    """
    result = Plan(start=progress)
    generation, last = progress.generation, progress.last_applied
    seen: set[tuple[int, int]] = set()
    for event in sorted(events, key=lambda e: e.version):
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


# ---------------------------------------------------------------- handlers


def resolve(route: StepRoute) -> dict[str, Entry]:
    """Import every handler of the route; ``RoutesError`` names those that cannot be imported."""
    found: dict[str, Entry] = {}
    problems = []
    for event_type, handler in route.handlers.items():
        module_name, _, name = handler.function.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            problems.append(
                f"route {route.stream}: handler {handler.function} for {event_type} "
                f"cannot be imported ({exc})"
            )
            continue
        if not callable(function):
            problems.append(f"route {route.stream}: handler {handler.function} is not callable")
            continue
        found[event_type] = (handler, function)
    if problems:
        raise RoutesError(problems)
    return found


# ---------------------------------------------------------------- I/O


def _json(rows: Any) -> str:
    """Statement input as one JSON text: far cheaper to send than several arrays."""
    return orjson.dumps(rows).decode()


class PipelinedError(Exception):
    """Raised when a pipelined statement failed and cannot be traced to one entity."""


class ManyFailedError(Exception):
    """Raised when a ``many`` call of several steps failed: which step it was is not known."""


class StepFailedError(Exception):
    """Raised inside a batch when a step function raised; the batch is rolled back."""

    def __init__(self, entity_id: str, event: Event, error: BaseException) -> None:
        super().__init__(f"{entity_id} seq {event.seq}: {error!r}")
        self.entity_id = entity_id
        self.event = event
        self.error = error


@dataclass(slots=True)
class BatchResult:
    """What a batch of step plans did."""

    plans: dict[str, Plan] = field(default_factory=dict)
    applied: int = 0


class StepStore:
    """PostgreSQL side of one step route."""

    def __init__(self, route: StepRoute, functions: Mapping[str, Entry]) -> None:
        self.route = route
        self.functions = functions

    def external(self, event: Event) -> bool:
        """True when the event's function acts outside PostgreSQL."""
        entry = self.functions.get(event.event_type)
        return entry is not None and entry[0].external

    def lock(self, conn: Conn, first_events: Mapping[str, Event]) -> dict[str, Progress]:
        """Create missing progress rows, then lock all of them in entity order."""
        ids = sorted(first_events)
        conn.execute(
            "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied) "
            "SELECT %s, e, g, 0 FROM jsonb_to_recordset(%s::jsonb) AS t(e text, g bigint) "
            "ON CONFLICT DO NOTHING",
            (self.route.stream, _json([{"e": i, "g": first_events[i].generation} for i in ids])),
        )
        rows = conn.execute(
            "SELECT entity_id, generation, last_applied, stopped_at_seq IS NOT NULL "
            "FROM inorder_step_progress WHERE route = %s AND entity_id IN "
            "(SELECT jsonb_array_elements_text(%s::jsonb)) ORDER BY entity_id FOR UPDATE",
            (self.route.stream, _json(ids)),
        ).fetchall()
        return {row[0]: Progress(row[1], row[2], row[3]) for row in rows}

    def read(self, conn: Conn, entity_ids: Sequence[str]) -> dict[str, Progress]:
        """Progress of the given entities, without locking them."""
        rows = conn.execute(
            "SELECT entity_id, generation, last_applied, stopped_at_seq IS NOT NULL "
            "FROM inorder_step_progress WHERE route = %s AND entity_id = ANY(%s)",
            (self.route.stream, list(entity_ids)),
        ).fetchall()
        return {row[0]: Progress(row[1], row[2], row[3]) for row in rows}

    def claim(self, conn: Conn, entity_id: str, start: Progress, end: Progress | None) -> bool:
        """Advance progress from ``start`` to ``end`` only if it is still at ``start``."""
        return end is not None and entity_id in self.claim_many(conn, [(entity_id, start, end)])

    def claim_many(self, conn: Conn, claims: Sequence[tuple[str, Progress, Progress]]) -> set[str]:
        """``claim`` for many entities in one statement; returns the entities claimed.

        The statement answers with the entities it could not claim (normally none),
        so a batch does not carry every claimed id back.
        """
        if not claims:
            return set()
        rows = conn.execute(
            "WITH c AS (SELECT * FROM jsonb_to_recordset(%s::jsonb) "
            " AS c(e text, sg bigint, sl bigint, ng bigint, nl bigint)), "
            "u AS (UPDATE inorder_step_progress AS p SET generation = c.ng, "
            " last_applied = c.nl, updated_at = now() FROM c WHERE p.route = %s "
            " AND p.entity_id = c.e AND p.generation = c.sg AND p.last_applied = c.sl "
            " AND p.stopped_at_seq IS NULL RETURNING p.entity_id) "
            "SELECT c.e FROM c WHERE NOT EXISTS (SELECT FROM u WHERE u.entity_id = c.e)",
            (_json([
                {"e": e, "sg": s.generation, "sl": s.last_applied, "ng": n.generation,
                 "nl": n.last_applied}
                for e, s, n in claims
            ]), self.route.stream),
        ).fetchall()  # fmt: skip
        return {e for e, _, _ in claims} - {row[0] for row in rows}

    def run(
        self,
        conn: Conn,
        applies: Mapping[str, Sequence[Event]],
        *,
        pipelined: bool = False,
        single: bool = False,
    ) -> None:
        """Call the functions of every entity's due steps (see ``calls``).

        A function's own failure becomes ``StepFailedError`` naming the step, or
        ``ManyFailedError`` for a ``many`` call of several steps; a lost connection stays
        what it is. In pipeline mode a database error may belong to another statement,
        so it becomes ``PipelinedError`` and the caller runs the batch again unpipelined.
        """
        for (handler, function), events in calls(applies, self.functions, single=single):
            try:
                function(conn, events if handler.many else events[0])
            except psycopg.OperationalError:
                raise
            except Exception as exc:  # a user function's failure, reported upward
                if pipelined and isinstance(exc, psycopg.Error):
                    raise PipelinedError(str(exc)) from exc
                if len(events) > 1:
                    raise ManyFailedError(f"{handler.function}: {exc!r}") from exc
                raise StepFailedError(events[0].entity_id, events[0], exc) from exc

    def record(self, conn: Conn, applied: Sequence[Event]) -> None:
        """Write the step log of everything applied in this transaction, in one statement."""
        if applied:
            conn.execute(
                "INSERT INTO inorder_step_log (route, entity_id, generation, seq, event_id, "
                "event_type) SELECT %s, e, g, s, i, t FROM jsonb_to_recordset(%s::jsonb) "
                "AS r(e text, g bigint, s bigint, i text, t text)",
                (self.route.stream, _json([
                    {"e": e.entity_id, "g": e.generation, "s": e.seq, "i": e.event_id,
                     "t": e.event_type}
                    for e in applied
                ])),
            )  # fmt: skip

    def stop(self, conn: Conn, entity_id: str, seq: int, reason: str) -> None:
        """Stop an entity before ``seq`` until a person looks at it."""
        conn.execute(
            "UPDATE inorder_step_progress SET stopped_at_seq = %s, stop_reason = %s, "
            "updated_at = now() WHERE route = %s AND entity_id = %s",
            (seq, reason[:1000], self.route.stream, entity_id),
        )
        log.error("step_stopped", route=self.route.stream, entity=entity_id, seq=seq, reason=reason)

    def hold(self, conn: Conn, entity_id: str) -> bool:
        """Mark an entity held (parking cap reached); True if it was not held before."""
        found = conn.execute(
            "UPDATE inorder_step_progress SET held_at = now() WHERE route = %s AND entity_id = %s "
            "AND held_at IS NULL RETURNING 1",
            (self.route.stream, entity_id),
        ).fetchone()
        return found is not None

    def begin_attempt(self, conn: Conn, event: Event) -> bool:
        """Record an external call before making it; False if an earlier one never finished."""
        found = conn.execute(
            "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
            (self.route.stream, event.entity_id, event.generation, event.seq, event.event_id),
        ).fetchone()
        return found is not None

    def finish_attempt(self, conn: Conn, event: Event) -> None:
        """Mark an external call done, in the transaction that records its step."""
        conn.execute(
            "UPDATE inorder_step_attempts SET completed_at = now() WHERE route = %s "
            "AND entity_id = %s AND generation = %s AND seq = %s",
            (self.route.stream, event.entity_id, event.generation, event.seq),
        )
