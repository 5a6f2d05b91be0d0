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
# One row, JSON as text cast by the statement (psycopg's ``emit`` of one event).
INSERT_TEXT = _insert((*("%s" for _ in _IDENTITY), "%s::jsonb", "%s::jsonb"))
# Many rows in one statement: the rows as one JSON array of objects, inserted in the
# array's order (so ``id``, which the table assigns row by row, keeps the writer's
# order). One statement costs the server one execution and the writer one parameter,
# where a statement per row costs each again for every row: a batch of 200 is written
# about twice as fast as by 200 statements, and faster than one array per column.
_RECORD = (
    "topic text, entity_type text, entity_id text, generation bigint, seq bigint, "
    "event_type text, event_id text, payload jsonb, headers jsonb"
)


def _insert_records(placeholder: str) -> str:
    names = ", ".join(COLUMNS)
    # Only the constant column names and the placeholder are formatted in.
    return (
        f"INSERT INTO outbox ({names}) SELECT {names} "  # noqa: S608
        f"FROM ROWS FROM (json_to_recordset(CAST({placeholder} AS json)) AS ({_RECORD})) "
        f"WITH ORDINALITY AS r({names}, n) ORDER BY n"
    )


# For psycopg and DB-API drivers, and for SQLAlchemy's ``text()``.
INSERT_RECORDS = _insert_records("%s")
INSERT_RECORDS_NAMED = _insert_records(":records")
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


def records(batch: list[OutboxEvent]) -> str:
    """The batch as the JSON array ``INSERT_RECORDS`` takes, one object per row."""
    return orjson.dumps(
        [
            dict(zip(COLUMNS, (*identity(e), dict(e.payload), dict(e.headers)), strict=True))
            for e in batch
        ]
    ).decode()


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
