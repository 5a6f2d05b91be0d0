"""The routes file (TOML): which kind of handling each entity stream gets. Parsing only, no I/O.

Example::

    [[route]]
    stream = "subscription"          # the events' entity_type
    kind = "projection"
    table = "billing_view"           # may be schema-qualified: "reporting.billing_view"
    key = "subscription_id"          # the column that holds entity_id
    [route.columns]                  # column = payload field (dotted for nested fields)
    plan = "plan"
    price_cents = "price_cents"

A step route names a function per event type; types without one still advance
the entity's sequence::

    [[route]]
    stream = "seat_ledger"
    kind = "step"
    max_parked = 1000                # per entity; beyond it events are held
    park_ttl_s = 604800
    [route.handlers]
    "seat_ledger.seats_added" = "billing.steps:add_seats"
    [route.handlers."seat_ledger.closed"]
    function = "billing.steps:send_goodbye"
    external = true                  # has an effect outside PostgreSQL
    idempotent = false               # so an interrupted call needs a person
    [route.handlers."seat_ledger.seats_moved"]
    function = "billing.steps:move_seats_many"
    many = true                      # takes a list of events: one call per batch

A batch route reassembles a batch's results in position order. It takes the
stream's ``batch.accepted`` events and the workers' results, whose entity_type is the
stream's name plus ``_result``::

    [[route]]
    stream = "batch"                 # results arrive as entity_type "batch_result"
    kind = "batch"
    output_topic = "inorder.batch.output"   # batch.assembled, via the consumer's outbox
    work_topic = "inorder.batch.work"       # where failed positions are dispatched again
    max_retries = 2                  # automatic re-dispatches of a certain failure
    deadline_s = 3600                # unless the batch sets its own
    on_incomplete = "hold"           # or "assemble_incomplete" (the default)

Every problem in the file is reported, each naming the route and what to fix.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from consumer.errors import RoutesError
from schemas import DEFAULT_TOPICS

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
STREAM = re.compile(r"[a-z][a-z0-9_]{0,62}\Z")
KINDS = ("projection", "step", "batch")
_STEP_KEYS = {"stream", "kind", "handlers", "max_parked", "park_ttl_s"}
_HANDLER_KEYS = {"function", "external", "idempotent", "many"}
_BATCH_KEYS = {
    "stream", "kind", "output_topic", "work_topic", "max_retries", "deadline_s", "on_incomplete",
}  # fmt: skip
ON_INCOMPLETE = ("assemble_incomplete", "hold")
TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")
FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")
_PROJECTION_KEYS = {
    "stream", "kind", "table", "key", "columns", "generation_column", "seq_column",
    "entity_type_column",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProjectionRoute:
    """Last writer wins: keep the newest (generation, seq) of each entity in one table row."""

    stream: str
    table: str
    key: str
    columns: Mapping[str, tuple[str, ...]]
    generation_column: str = "generation"
    seq_column: str = "seq"
    # For a table shared by several streams: a column that holds the entity_type.
    entity_type_column: str | None = None
    kind: str = field(default="projection", init=False)

    @property
    def schema_and_table(self) -> tuple[str | None, str]:
        """The table's schema (None: the search path) and name."""
        schema, _, name = self.table.rpartition(".")
        return (schema or None), name


@dataclass(frozen=True, slots=True)
class Handler:
    """The function that performs one event type's step, as ``module:function``."""

    function: str
    # The function acts outside PostgreSQL (an email, an HTTP call): attempts are recorded.
    external: bool = False
    # Calling it twice is harmless, so an interrupted attempt may be retried automatically.
    idempotent: bool = False
    # The function takes a list of events, fn(conn, events), and applies them all in the
    # order given (each entity's in seq order): one call, and set-based SQL, per batch.
    many: bool = False


@dataclass(frozen=True, slots=True)
class StepRoute:
    """Ordered steps: every event applied once, in seq order; early arrivals are parked."""

    stream: str
    handlers: Mapping[str, Handler]
    max_parked: int = 1000
    park_ttl_s: int = 7 * 86_400
    kind: str = field(default="step", init=False)


@dataclass(frozen=True, slots=True)
class BatchRoute:
    """Batch reassembly: a manifest per batch, results by position, output in position order."""

    stream: str
    output_topic: str = DEFAULT_TOPICS.batch_output
    work_topic: str = DEFAULT_TOPICS.batch_work
    max_retries: int = 0
    deadline_s: int = 3600
    on_incomplete: str = "assemble_incomplete"
    kind: str = field(default="batch", init=False)

    @property
    def result_stream(self) -> str:
        """The entity stream the workers' results arrive in."""
        return f"{self.stream}_result"

    @property
    def streams(self) -> tuple[str, str]:
        """Every entity stream this route takes."""
        return (self.stream, self.result_stream)


Route = ProjectionRoute | StepRoute | BatchRoute


def streams_of(route: Route) -> tuple[str, ...]:
    """The entity streams a route takes (a batch route takes its results' stream too)."""
    return route.streams if isinstance(route, BatchRoute) else (route.stream,)


def _identifier(problems: list[str], where: str, name: str, value: Any) -> str:
    if not isinstance(value, str) or not IDENTIFIER.match(value):
        problems.append(
            f"{where}: {name} must be an SQL identifier (letters, digits, _), got {value!r}"
        )
        return ""
    return value


def _table(problems: list[str], where: str, value: Any) -> str:
    parts = value.split(".") if isinstance(value, str) else [value]
    if len(parts) > 2:
        problems.append(f"{where}: table must be 'name' or 'schema.name', got {value!r}")
        return ""
    return ".".join(_identifier(problems, where, "table", p) for p in parts)


def _columns(problems: list[str], where: str, value: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, Mapping) or not value:
        problems.append(f"{where}: [route.columns] must map at least one column to a payload field")
        return {}
    out = {}
    for column, path in value.items():
        _identifier(problems, where, "a column", column)
        if not isinstance(path, str) or not path or "" in path.split("."):
            problems.append(f"{where}: column {column} must name a payload field, got {path!r}")
            continue
        out[column] = tuple(path.split("."))
    return out


def _projection(problems: list[str], where: str, spec: Mapping[str, Any]) -> ProjectionRoute:
    for unknown in sorted(set(spec) - _PROJECTION_KEYS):
        problems.append(f"{where}: unknown setting {unknown!r} for a projection route")
    for required in ("table", "key", "columns"):
        if required not in spec:
            problems.append(f"{where}: a projection route needs {required!r}")
    entity_type_column = spec.get("entity_type_column")
    return ProjectionRoute(
        stream=spec["stream"],
        table=_table(problems, where, spec.get("table", "")) if "table" in spec else "",
        key=_identifier(problems, where, "key", spec["key"]) if "key" in spec else "",
        columns=_columns(problems, where, spec.get("columns")) if "columns" in spec else {},
        generation_column=_identifier(
            problems, where, "generation_column", spec.get("generation_column", "generation")
        ),
        seq_column=_identifier(problems, where, "seq_column", spec.get("seq_column", "seq")),
        entity_type_column=(
            _identifier(problems, where, "entity_type_column", entity_type_column)
            if entity_type_column is not None
            else None
        ),
    )


def _route(problems: list[str], index: int, spec: Any) -> Route | None:
    where = f"route {index + 1}"
    if not isinstance(spec, Mapping):
        problems.append(f"{where}: must be a table ([[route]])")
        return None
    stream = spec.get("stream")
    if not isinstance(stream, str) or not STREAM.match(stream):
        problems.append(
            f"{where}: stream must be an entity_type like 'subscription', got {stream!r}"
        )
        return None
    where = f"route {index + 1} ({stream})"
    kind = spec.get("kind")
    if kind not in KINDS:
        problems.append(f"{where}: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        return None
    if kind == "step":
        return _step(problems, where, spec)
    if kind == "batch":
        return _batch(problems, where, spec)
    return _projection(problems, where, spec)


def _handler(problems: list[str], where: str, event_type: str, spec: Any) -> Handler | None:
    if isinstance(spec, str):
        spec = {"function": spec}
    if not isinstance(spec, Mapping):
        problems.append(f"{where}: handler for {event_type} must be 'module:function' or a table")
        return None
    for unknown in sorted(set(spec) - _HANDLER_KEYS):
        problems.append(f"{where}: unknown setting {unknown!r} for handler {event_type}")
    function = spec.get("function")
    if not isinstance(function, str) or not FUNCTION.match(function):
        problems.append(
            f"{where}: handler for {event_type} must be 'module:function', got {function!r}"
        )
        return None
    flags = {k: spec.get(k, False) for k in ("external", "idempotent", "many")}
    for name, value in flags.items():
        if not isinstance(value, bool):
            problems.append(f"{where}: {name} of handler {event_type} must be true or false")
    if flags["many"] is True and flags["external"] is True:
        problems.append(
            f"{where}: handler {event_type} cannot be both many and external "
            "(an outside call is recorded and made one event at a time)"
        )
    return Handler(
        function, flags["external"] is True, flags["idempotent"] is True, flags["many"] is True
    )


def _positive(
    problems: list[str], where: str, spec: Mapping[str, Any], name: str, default: int
) -> int:
    value = spec.get(name, default)
    if type(value) is not int or value < 1:
        problems.append(f"{where}: {name} must be a whole number >= 1, got {value!r}")
        return default
    return value


def _step(problems: list[str], where: str, spec: Mapping[str, Any]) -> StepRoute:
    for unknown in sorted(set(spec) - _STEP_KEYS):
        problems.append(f"{where}: unknown setting {unknown!r} for a step route")
    raw = spec.get("handlers", {})
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: [route.handlers] must map event types to functions")
        raw = {}
    handlers = {}
    for event_type, handler_spec in raw.items():
        handler = _handler(problems, where, event_type, handler_spec)
        if handler is not None:
            handlers[event_type] = handler
    return StepRoute(
        stream=spec["stream"],
        handlers=handlers,
        max_parked=_positive(problems, where, spec, "max_parked", 1000),
        park_ttl_s=_positive(problems, where, spec, "park_ttl_s", 7 * 86_400),
    )


def _topic(
    problems: list[str], where: str, spec: Mapping[str, Any], name: str, default: str
) -> str:
    value = spec.get(name, default)
    if not isinstance(value, str) or not TOPIC.match(value):
        problems.append(f"{where}: {name} must be a Kafka topic name, got {value!r}")
        return default
    return value


def _batch(problems: list[str], where: str, spec: Mapping[str, Any]) -> BatchRoute:
    for unknown in sorted(set(spec) - _BATCH_KEYS):
        problems.append(f"{where}: unknown setting {unknown!r} for a batch route")
    retries = spec.get("max_retries", 0)
    if type(retries) is not int or retries < 0:
        problems.append(f"{where}: max_retries must be a whole number >= 0, got {retries!r}")
        retries = 0
    on_incomplete = spec.get("on_incomplete", "assemble_incomplete")
    if on_incomplete not in ON_INCOMPLETE:
        problems.append(
            f"{where}: on_incomplete must be one of {', '.join(ON_INCOMPLETE)}, "
            f"got {on_incomplete!r}"
        )
        on_incomplete = "assemble_incomplete"
    if len(spec["stream"]) > 56:
        problems.append(f"{where}: a batch stream name must be at most 56 characters")
    return BatchRoute(
        stream=spec["stream"],
        output_topic=_topic(problems, where, spec, "output_topic", DEFAULT_TOPICS.batch_output),
        work_topic=_topic(problems, where, spec, "work_topic", DEFAULT_TOPICS.batch_work),
        max_retries=retries,
        deadline_s=_positive(problems, where, spec, "deadline_s", 3600),
        on_incomplete=on_incomplete,
    )


def parse_routes(text: str, source: str = "routes file") -> list[Route]:
    """Parse and check a routes file; ``RoutesError`` lists every problem found."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RoutesError([f"{source}: not valid TOML ({exc})"]) from exc
    problems: list[str] = []
    specs = doc.get("route")
    if not isinstance(specs, list) or not specs:
        raise RoutesError([f"{source}: no [[route]] tables; route at least one stream"])
    for unknown in sorted(set(doc) - {"route"}):
        problems.append(f"{source}: unknown top-level key {unknown!r}")
    routes: list[Route] = []
    seen: dict[str, int] = {}
    for index, spec in enumerate(specs):
        route = _route(problems, index, spec)
        if route is None:
            continue
        for stream in streams_of(route):
            if stream in seen:
                problems.append(
                    f"route {index + 1} ({route.stream}): stream {stream} already routed by "
                    f"route {seen[stream] + 1}; a stream has exactly one route"
                )
            seen[stream] = index
        routes.append(route)
    if problems:
        raise RoutesError(problems)
    return routes
