"""An outbox event, the checks it passes before any writer sends it, and its row's values.

Pure: every writer (psycopg, psycopg async, SQLAlchemy, Django) checks events here and
turns a unique violation into ``DuplicateEventError`` here, so they refuse the same things.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from schemas import DEFAULT_TOPICS, PayloadError, PayloadSchemas, default_event_id, tracing
from schemas.codec import field_problem
from schemas.errors import DuplicateEventError, InvalidEventError
from schemas.limits import MAX_DEPTH, MAX_PAYLOAD_DEPTH, value_problem
from schemas.runtime.payloads import default_payload_schemas

# The columns every writer fills, in this order; payload and headers are jsonb.
COLUMNS = (
    "topic",
    "entity_type",
    "entity_id",
    "generation",
    "seq",
    "event_type",
    "event_id",
    "payload",
    "headers",
)


def _insert(placeholders: tuple[str, ...]) -> str:
    names = ", ".join(COLUMNS)
    # Only the constant column names and placeholders above are formatted in.
    return f"INSERT INTO outbox ({names}) VALUES ({', '.join(placeholders)})"  # noqa: S608


_IDENTITY = COLUMNS[:-2]  # the columns before payload and headers
# For psycopg, which binds payload and headers as ``Jsonb``.
INSERT = _insert(("%s",) * len(COLUMNS))
# For drivers reached through another library: JSON as text, cast by the statement.
INSERT_TEXT = _insert((*("%s" for _ in _IDENTITY), "%s::jsonb", "%s::jsonb"))
# The same with named parameters (SQLAlchemy's ``text()``).
INSERT_NAMED = _insert(
    (*(f":{c}" for c in _IDENTITY), "CAST(:payload AS jsonb)", "CAST(:headers AS jsonb)")
)
_UNIQUE_VIOLATION = "23505"
# Headers are a few trace and routing values; the table refuses more than 64 KiB of them
# (migration 0005), and a writer is told here first, counting characters (a character
# takes at least one byte, and a header's JSON adds quotes and a colon to each).
MAX_HEADERS_CHARS = 32768


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """One event to write: the entity, its version from this transaction, and the payload."""

    entity_type: str
    entity_id: str
    seq: int
    event_type: str
    payload: Mapping[str, Any]
    generation: int = 1
    topic: str = DEFAULT_TOPICS.events
    headers: Mapping[str, str] = field(default_factory=dict)
    event_id: str | None = None

    @property
    def resolved_event_id(self) -> str:
        """The event id, defaulting to ``entity_type:entity_id:generation:seq``."""
        return self.event_id or default_event_id(
            self.entity_type, self.entity_id, self.generation, self.seq
        )


def check(event: OutboxEvent, schemas: PayloadSchemas) -> None:
    """Raise ``InvalidEventError`` when ``event`` breaks the envelope or its payload schema."""
    for name in ("entity_type", "entity_id", "generation", "seq", "event_type"):
        problem = field_problem(name, getattr(event, name))
        if problem is not None:
            raise InvalidEventError(problem[1])
    problem = field_problem("event_id", event.resolved_event_id)
    if problem is not None:
        raise InvalidEventError(f"event_id {event.resolved_event_id!r}: {problem[1]}")
    for where, value, depth in (
        ("payload", event.payload, MAX_PAYLOAD_DEPTH),
        ("headers", event.headers, MAX_DEPTH),
    ):
        beyond = value_problem(value, depth, where=where)
        if beyond is not None:
            raise InvalidEventError(f"{beyond[1]} ({beyond[0]})")
    if not all(isinstance(v, str) for v in event.headers.values()):
        raise InvalidEventError("headers must map names to strings")
    size = sum(len(k) + len(v) for k, v in event.headers.items())
    if size > MAX_HEADERS_CHARS:
        raise InvalidEventError(f"headers hold {size} characters, over {MAX_HEADERS_CHARS}")
    try:
        schemas.validate(event.event_type, event.payload)
    except PayloadError as exc:
        raise InvalidEventError(str(exc)) from exc


def checked(events: Iterable[OutboxEvent], schemas: PayloadSchemas | None) -> list[OutboxEvent]:
    """Every event, each checked (against the default registry when none is given)."""
    registry = schemas or default_payload_schemas()
    batch = list(events)
    for event in batch:
        check(event, registry)
    if tracing.INSTALLED:
        # The current span's context goes with each row (when there is one).
        batch = [_traced(event) for event in batch]
    return batch


def _traced(event: OutboxEvent) -> OutboxEvent:
    """``event`` with the current trace context in its headers (as it was when there is none)."""
    headers = tracing.carried(event.headers)
    return event if headers is event.headers else replace(event, headers=headers)


def identity(event: OutboxEvent) -> tuple[Any, ...]:
    """The row's values up to ``event_id``, in ``COLUMNS`` order (payload and headers follow)."""
    return (
        event.topic,
        event.entity_type,
        event.entity_id,
        event.generation,
        event.seq,
        event.event_type,
        event.resolved_event_id,
    )


def values(event: OutboxEvent) -> tuple[Any, ...]:
    """The row's values in ``COLUMNS`` order, payload and headers as JSON text."""
    return (
        *identity(event),
        orjson.dumps(dict(event.payload)).decode(),
        orjson.dumps(dict(event.headers)).decode(),
    )


def named(event: OutboxEvent) -> dict[str, Any]:
    """The row's values by column name, for ``INSERT_NAMED``."""
    return dict(zip(COLUMNS, values(event), strict=True))


def duplicate_of(exc: BaseException) -> DuplicateEventError | None:
    """The ``DuplicateEventError`` a unique violation raised through any driver or library means.

    Walks the wrapping a library adds (SQLAlchemy's ``orig``, Django's ``__cause__``) to
    the driver's error, and reads the constraint as psycopg, psycopg2 or asyncpg give it.
    """
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        code = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if code == _UNIQUE_VIOLATION:
            diag = getattr(seen, "diag", None)
            constraint = getattr(diag, "constraint_name", None) or getattr(
                seen, "constraint_name", None
            )
            detail = getattr(diag, "message_detail", None) or getattr(seen, "detail", None)
            return DuplicateEventError(detail or str(seen), constraint)
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None
