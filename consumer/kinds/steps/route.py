"""A ``step`` route: its settings in the routes file, and its handlers imported once.

A step route names a function per event type; types without one still advance the
entity's sequence::

    [[route]]
    stream = "seat_ledger"
    kind = "step"
    max_parked = 1000                # per entity; beyond it events are held
    park_ttl_s = 604800
    lanes = 16                       # entities with external calls applied at once
    [route.handlers]
    "seat_ledger.seats_added" = "billing.steps:add_seats"
    [route.handlers."seat_ledger.closed"]
    function = "billing.steps:send_goodbye"
    external = true                  # has an effect outside PostgreSQL
    idempotent = false               # so an interrupted call needs a person
    [route.handlers."seat_ledger.seats_moved"]
    function = "billing.steps:move_seats_many"
    many = true                      # takes a list of events: one call per batch
    [route.handlers."seat_ledger.seats_moved".retry]
    attempts = 4                     # a raising step is called again later (``retries``)
    [route.handlers."seat_ledger.seats_set"]   # one statement a step, no function
    sql = "UPDATE seat_totals SET seats = %(seq)s WHERE subscription_id = %(entity_id)s"
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from consumer.errors import RoutesError
from consumer.kinds._route import OneStream
from consumer.kinds._spec import Spec, names, setting
from consumer.kinds.steps import statement
from consumer.kinds.steps.retries import MOST_ATTEMPTS, MOST_BACKOFF_S, Retry, Then

FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")
# The most lanes a route may set (each holds a connection while it works).
MAX_LANES = 256
_FLAGS = ("external", "idempotent", "many")


@dataclass(frozen=True, slots=True)
class Handler:
    """The function that performs one event type's step, as ``module:function``."""

    function: str = setting(
        "The handler, `module:function`; a string alone is this (one of `function` and `sql`)",
        "",
    )
    sql: str = setting(
        "In place of a function: one SQL statement run for each step, in its transaction, "
        "its parameters the event's fields as `%(seq)s` (`event_id`, `event_type`, "
        "`entity_type`, `entity_id`, `generation`, `seq`, `occurred_at`, `payload` as "
        "jsonb); a poll batch's steps of the type are sent together, each in order",
        "",
    )
    external: bool = setting(
        "It acts outside PostgreSQL (a mail, an HTTP call): each attempt is recorded first",
        False,
    )
    idempotent: bool = setting(
        "Calling it twice is harmless, so an interrupted attempt is made again by itself "
        "instead of stopping the entity for review",
        False,
    )
    many: bool = setting(
        "It takes a list, `fn(conn, events)`, and applies them in the order given (each "
        "entity's in seq order): one call per batch; not with `external`",
        False,
    )
    retry: Retry | None = setting(
        '`[route.handlers."TYPE".retry]`: call a step that raised again later, with the '
        "settings below; only that entity waits (unset: it stops for a person at once)",
        None,
    )


@dataclass(frozen=True, slots=True)
class StepRoute(OneStream):
    """Ordered steps: every event applied once, in seq order; early arrivals are parked."""

    stream: str
    handlers: Mapping[str, Handler] = setting(
        '`[route.handlers]`: event type = handler (`"module:function"` or a table of the '
        "handler settings below); types without one still advance the entity",
        factory=dict,
    )
    max_parked: int = setting("Events parked per entity; beyond it they go to the held topic", 1000)
    max_parked_bytes: int = setting(
        "Bytes parked per entity (its events' lengths); beyond it they go to the held topic",
        64 * 1024 * 1024,
    )
    park_ttl_s: int = setting("How long a parked event is kept in Redis (seconds)", 7 * 86_400)
    lanes: int | None = setting(
        "Entities whose steps call outside PostgreSQL (`external`) applied at once, each lane "
        "on a PostgreSQL connection of its own; one entity's steps stay in one lane, in order "
        "(unset: the consumer's `INORDER_STEP_LANES`, 1 unless set)",
        None,
    )
    keep_lanes_open: bool = setting(
        "With more than one lane: open the lanes' connections at start-up and keep them "
        "open, so a burst of external steps never waits for its lanes to connect (off: each "
        "opens when a lane first needs it and closes after ten idle minutes)",
        False,
    )
    baseline: bool = setting(
        "A `<stream>.snapshot` event (`inorder-producer snapshot`) newer than where an entity "
        "stands moves it on to the snapshot's version, logged as the snapshot (a handler for "
        "that type may rebuild the state); off, snapshots are ignored",
        False,
    )
    snapshot_when_unrecoverable: bool = setting(
        "With `baseline`: when a gap can no longer be republished, the sweeper asks the "
        "producer for a snapshot of the entity (`inorder-producer snapshot STREAM "
        "--requested` takes the asks); the entity moves on once it comes",
        False,
    )
    kind: str = field(default="step", init=False)


# fn(conn, event), or fn(conn, events) for a handler declared ``many``; or
# ``async def fn(aconn, event)`` on psycopg's AsyncConnection.
StepFunction = Callable[[psycopg.Connection[Any], Any], None]
Entry = tuple[Handler, StepFunction]


def _handler(spec: Spec, event_type: str, value: Any) -> Handler | None:
    if isinstance(value, str):
        value = {"function": value}
    if not isinstance(value, Mapping):
        spec.problem(f"handler for {event_type} must be 'module:function' or a table")
        return None
    for unknown in sorted(set(value) - names(Handler)):
        spec.problem(f"unknown setting {unknown!r} for handler {event_type}")
    retry = _retry(spec, event_type, value)
    if "sql" in value:
        return _statement(spec, event_type, value, retry)
    function = value.get("function")
    if not isinstance(function, str) or not FUNCTION.match(function):
        spec.problem(f"handler for {event_type} must be 'module:function', got {function!r}")
        return None
    flags = {k: value.get(k, False) for k in _FLAGS}
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            spec.problem(f"{name} of handler {event_type} must be true or false")
    if flags["many"] is True and flags["external"] is True:
        spec.problem(
            f"handler {event_type} cannot be both many and external "
            "(an outside call is recorded and made one event at a time)"
        )
    if retry is not None and flags["external"] is True and flags["idempotent"] is not True:
        spec.problem(
            f"handler {event_type} is external and not idempotent: a call that raised may "
            "have taken effect, so it is never made again by itself (drop retry, or set "
            "idempotent = true if a second call is harmless)"
        )
    return Handler(
        function,
        external=flags["external"] is True,
        idempotent=flags["idempotent"] is True,
        many=flags["many"] is True,
        retry=retry,
    )


def _statement(
    spec: Spec, event_type: str, value: Mapping[str, Any], retry: Retry | None
) -> Handler | None:
    """A handler given as ``sql``: the statement read (``statement.problem``); no function,
    and none of the flags, which a statement inside the step's transaction has no use for."""
    sql = value["sql"]
    where = f"sql of handler {event_type}"
    if not isinstance(sql, str):
        spec.problem(f"{where} must be a string")
        return None
    wrong = statement.problem(sql)
    if wrong is not None:
        spec.problem(f"{where} {wrong}")
        return None
    for name in ("function", *_FLAGS):
        if name in value:
            spec.problem(
                f"handler {event_type} has sql: {name} does not go with it (the statement "
                "runs inside the step's transaction, for every step of the batch together)"
            )
    return Handler(sql=sql, retry=retry)


def _retry(spec: Spec, event_type: str, value: Mapping[str, Any]) -> Retry | None:
    """The handler's ``retry`` table, checked; None when it has none (or it is wrong)."""
    raw = value.get("retry")
    if raw is None:
        return None
    where = f"retry of handler {event_type}"
    if not isinstance(raw, Mapping):
        spec.problem(f"{where} must be a table")
        return None
    for unknown in sorted(set(raw) - names(Retry)):
        spec.problem(f"unknown setting {unknown!r} in {where}")
    found = Retry()
    attempts = raw.get("attempts", found.attempts)
    if type(attempts) is not int or not 1 <= attempts <= MOST_ATTEMPTS:
        spec.problem(f"attempts in {where} must be a whole number from 1 to {MOST_ATTEMPTS}")
    waits = {}
    for name in ("backoff_s", "max_backoff_s"):
        wait = raw.get(name, getattr(found, name))
        if type(wait) not in (int, float) or not 0 < wait <= MOST_BACKOFF_S:
            spec.problem(f"{name} in {where} must be a number of seconds over 0, at most 7 days")
        waits[name] = float(wait) if type(wait) in (int, float) else 0.0
    on = raw.get("on", [])
    if not isinstance(on, list) or not all(isinstance(n, str) and n.strip() for n in on):
        spec.problem(f"on in {where} must be a list of exception class names")
        on = []
    then = raw.get("then", found.then)
    if then not in set(Then):
        spec.problem(f"then in {where} must be one of {', '.join(Then)}, got {then!r}")
        then = Then.STOP
    return Retry(attempts, on=tuple(on), then=Then(then), **waits)


def parse(spec: Spec) -> StepRoute:
    """A step route from its ``[[route]]`` table; problems go to ``spec``."""
    spec.only("step", names(StepRoute))
    raw = spec.values.get("handlers", {})
    if not isinstance(raw, Mapping):
        spec.problem("[route.handlers] must map event types to functions")
        raw = {}
    handlers = {}
    for event_type, value in raw.items():
        handler = _handler(spec, event_type, value)
        if handler is not None:
            handlers[event_type] = handler
    return StepRoute(
        stream=spec.stream,
        handlers=handlers,
        max_parked=spec.positive("max_parked", StepRoute),
        max_parked_bytes=spec.positive("max_parked_bytes", StepRoute),
        park_ttl_s=spec.positive("park_ttl_s", StepRoute),
        lanes=_lanes(spec),
        keep_lanes_open=spec.flag("keep_lanes_open", StepRoute),
        baseline=spec.flag("baseline", StepRoute),
        snapshot_when_unrecoverable=_snapshot_asked(spec),
    )


def _snapshot_asked(spec: Spec) -> bool:
    asked = spec.flag("snapshot_when_unrecoverable", StepRoute)
    if asked and spec.values.get("baseline") is not True:
        spec.problem(
            "snapshot_when_unrecoverable needs baseline = true: a snapshot moves an entity "
            "past its gap only on a route that takes snapshots as a baseline"
        )
    return asked


def _lanes(spec: Spec) -> int | None:
    lanes = spec.values.get("lanes")
    if lanes is None:
        return None
    if type(lanes) is not int or not 1 <= lanes <= MAX_LANES:
        spec.problem(f"lanes must be a whole number from 1 to {MAX_LANES}, got {lanes!r}")
        return None
    return lanes


def resolve(route: StepRoute) -> dict[str, Entry]:
    """Import every handler of the route; ``RoutesError`` names those that cannot be imported."""
    found: dict[str, Entry] = {}
    problems = []
    for event_type, handler in route.handlers.items():
        if handler.sql:  # run for the batch's steps together, as a many function is
            found[event_type] = (
                replace(handler, many=True, function=f"sql of {event_type}"),
                statement.runner(handler.sql),
            )
            continue
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
        if handler.many and inspect.iscoroutinefunction(function):
            problems.append(
                f"route {route.stream}: handler {handler.function} is async def, which takes "
                "one event at a time: it cannot be many"
            )
            continue
        found[event_type] = (handler, function)
    if problems:
        raise RoutesError(problems)
    return found
