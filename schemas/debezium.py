"""Events from a Debezium outbox: messages as Debezium's outbox event router writes them.

The router (``io.debezium.transforms.outbox.EventRouter``) turns each row a service
inserts into its outbox table into one message: the key is the aggregate id
(``table.field.event.key``), the header ``id`` the row's id, the value its payload, the
topic ``route.topic.replacement`` with the row's ``route.by.field`` in it
(``outbox.event.<aggregatetype>`` by default); ``table.fields.additional.placement``
places further columns in headers. inorder reads, from such a message:

- the stream (``entity_type``): the header the route-by field is placed in, else the
  part of the topic the replacement's ``${routedByValue}`` stands for;
- the entity id: the key (text, or a JSON string as Debezium's JSON converter writes it);
- the event type, seq and generation: the headers their columns are placed in (a table
  without a generation column is generation 1);
- the time (``occurred_at`` and ``published_at``): the message's timestamp;
- the payload: the value, a JSON object or a JSON string holding one.

``Shape`` is the user's router configuration as inorder needs it; ``envelope`` reads a
message into inorder's envelope, which the codec then checks as any other; ``message``
writes the message the router would write for a row (the relay's republish-only role).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from schemas.cloudevents import AMBIGUOUS, Headers, whole_number
from schemas.codec import (
    BAD_FORMAT,
    INVALID_UTF8,
    MAX_MESSAGE_BYTES,
    MISSING_FIELD,
    check_size,
)
from schemas.errors import DecodeError
from schemas.limits import MAX_PAYLOAD_DEPTH, NOT_JSON, TOO_DEEP, text_problem

# Where the router's topic replacement puts the route-by field's value.
ROUTED = "${routedByValue}"
# The header the router always writes: the row's id, inorder's event_id.
ID_HEADER = "id"
# What Kafka Connect's JSON converter wraps a value in when it writes schemas.
_SCHEMA_ENVELOPE = frozenset({"schema", "payload"})
_PLACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*):(header|envelope)(?::([A-Za-z0-9_.-]+))?\Z")


def placements(text: str) -> dict[str, tuple[str, str]]:
    """``table.fields.additional.placement`` as field -> (``header`` or ``envelope``, name).

    ``ValueError`` names an entry that is not ``field:header[:name]`` or
    ``field:envelope[:name]`` (the name defaults to the field's).
    """
    found: dict[str, tuple[str, str]] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        matched = _PLACED.match(entry)
        if matched is None:
            raise ValueError(f"{entry!r} is not field:header[:name] or field:envelope[:name]")
        column, where, name = matched.groups()
        found[column] = (where, name or column)
    return found


@dataclass(frozen=True, slots=True)
class Shape:
    """The parts of a user's EventRouter configuration that say where inorder's fields are."""

    placement: str = ""
    route_by_field: str = "aggregatetype"
    topic_replacement: str = f"outbox.event.{ROUTED}"
    type_field: str = "type"
    seq_field: str = "seq"
    generation_field: str | None = None
    _placed: dict[str, tuple[str, str]] = field(init=False, repr=False, compare=False)
    # Why the placement cannot be read (None: it can); it then places nothing.
    _unreadable: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        placed, unreadable = {}, None
        try:
            placed = placements(self.placement)
        except ValueError as exc:
            unreadable = f"the placement {exc}"
        object.__setattr__(self, "_placed", placed)
        object.__setattr__(self, "_unreadable", unreadable)

    def problems(self) -> list[str]:
        """What keeps this configuration from naming every field inorder needs (start-up)."""
        if self._unreadable is not None:
            return [self._unreadable]
        problems = [
            f"field {column!r} is placed in the envelope: inorder reads the value as the "
            "payload, so place it in a header instead"
            for column, (where, _) in self._placed.items()
            if where == "envelope"
        ]
        needed = [self.type_field, self.seq_field]
        if self.generation_field:
            needed.append(self.generation_field)
        for column in needed:
            if self.header(column) is None:
                problems.append(
                    f"field {column!r} is not placed in a header: add "
                    f"'{column}:header:<name>' to the placement (as given to Debezium's "
                    "table.fields.additional.placement)"
                )
        if self.header(self.route_by_field) is None and self.topic_replacement.count(ROUTED) != 1:
            problems.append(
                f"the stream is in neither a header (place {self.route_by_field!r} in one) nor "
                f"the topic (the topic replacement must hold {ROUTED} once)"
            )
        return problems

    def in_headers(self) -> list[str]:
        """The columns placed in headers, in the placement's order."""
        return [c for c, (where, _) in self._placed.items() if where == "header"]

    def header(self, column: str) -> str | None:
        """The header a column is placed in (None: not placed in one)."""
        where, name = self._placed.get(column, ("", ""))
        return name if where == "header" else None

    def stream_of(self, topic: str, headers: Mapping[str, str]) -> str | None:
        """The stream a message belongs to: the route-by header, else the topic's part."""
        placed = self.header(self.route_by_field)
        if placed is not None:
            return headers.get(placed)
        before, _, after = self.topic_replacement.partition(ROUTED)
        if len(topic) <= len(before) + len(after):
            return None
        if not (topic.startswith(before) and topic.endswith(after)):
            return None
        return topic[len(before) : len(topic) - len(after)]

    def topic_for(self, stream: str) -> str:
        """The topic the router sends a row of this stream to."""
        return self.topic_replacement.replace(ROUTED, stream)


def _text(value: str | bytes | None, name: str, raw: bytes | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise DecodeError(INVALID_UTF8, f"{name} is not UTF-8", raw) from None


def _headers(headers: Headers | None, wanted: set[str], raw: bytes | None) -> dict[str, str]:
    """The wanted headers' text; one said twice, two ways, is refused as ambiguous."""
    found: dict[str, str] = {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        if name not in wanted:
            continue
        text = _text(value, f"header {name}", raw)
        if text is None:
            continue
        if found.setdefault(name, text) != text:
            detail = f"header {name[:40]} comes twice with different values: which one is meant?"
            raise DecodeError(AMBIGUOUS, detail, raw, name)
    return found


def _entity_id(key: str | bytes | None, raw: bytes | None) -> str:
    text = _text(key, "the key", raw)
    if not text:
        raise DecodeError(MISSING_FIELD, "the message has no key (the aggregate id)", raw, "key")
    if len(text) > 1 and text[0] == '"' and text[-1] == '"':  # the JSON converter's string
        try:
            unquoted = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
        if isinstance(unquoted, str):
            return unquoted
    return text


def _payload(value: bytes | None, raw: bytes | None) -> Any:
    if not value:
        raise DecodeError(MISSING_FIELD, "the message has no value (the payload)", raw, "payload")
    deep = text_problem(value, "the payload", MAX_PAYLOAD_DEPTH)
    if deep is not None:
        raise DecodeError(*deep, raw)
    try:
        payload = orjson.loads(value)
        if isinstance(payload, dict) and set(payload) == _SCHEMA_ENVELOPE:
            raise DecodeError(
                BAD_FORMAT,
                "the value is a Kafka Connect schema envelope (schema, payload): set the "
                "connector's value.converter.schemas.enable=false or use the string converter",
                raw,
                "payload",
            )
        if isinstance(payload, str):  # a jsonb or text column through the JSON converter
            deep = text_problem(payload, "the payload", MAX_PAYLOAD_DEPTH)
            if deep is not None:
                raise DecodeError(*deep, raw)
            payload = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "recursion" in str(exc).lower():
            detail = f"the payload nests deeper than {MAX_PAYLOAD_DEPTH} levels"
            raise DecodeError(TOO_DEEP, detail, raw) from None
        raise DecodeError(NOT_JSON, f"the payload is not JSON: {exc}", raw) from None
    return payload


def _time(timestamp_ms: int | None, raw: bytes | None) -> str:
    if timestamp_ms is None or timestamp_ms < 0:
        raise DecodeError(MISSING_FIELD, "the message has no timestamp", raw, "occurred_at")
    at = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _document(
    shape: Shape,
    topic: str,
    key: str | bytes | None,
    headers: Headers | None,
    value: bytes | None,
    timestamp_ms: int | None,
) -> dict[str, Any]:
    # The headers each field must come in (a field placed in none is never found).
    required = {
        "event_id": ID_HEADER,
        "event_type": shape.header(shape.type_field) or "",
        "seq": shape.header(shape.seq_field) or "",
    }
    if shape.generation_field:
        required["generation"] = shape.header(shape.generation_field) or ""
    stream_header = shape.header(shape.route_by_field)
    wanted = {*required.values(), *([stream_header] if stream_header else [])}
    found = _headers(headers, wanted, value)
    for what, name in required.items():
        if name not in found:
            raise DecodeError(MISSING_FIELD, f"the message has no header {name} ({what})", value)
    stream = shape.stream_of(topic, found)
    if stream is None:
        detail = f"no stream: topic {topic[:100]!r} is not {shape.topic_replacement!r}"
        raise DecodeError(BAD_FORMAT, detail, value, "entity_type")
    at = _time(timestamp_ms, value)
    generation = found.get(required.get("generation", ""), 1)
    return {
        "event_id": found[ID_HEADER],
        "event_type": found[required["event_type"]],
        "entity_type": stream,
        "entity_id": _entity_id(key, value),
        "generation": whole_number(generation, "generation", value),
        "seq": whole_number(found[required["seq"]], "seq", value),
        "occurred_at": at,
        "published_at": at,
        "payload": _payload(value, value),
    }


def envelope(
    shape: Shape,
    topic: str,
    key: str | bytes | None,
    headers: Headers | None,
    value: bytes | None,
    timestamp_ms: int | None,
    *,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> bytes:
    """inorder's envelope (JSON) of a message Debezium's outbox event router wrote.

    ``DecodeError`` says why the message cannot be one of inorder's events; nothing else
    escapes, whatever the message holds.
    """
    try:
        if value is not None:
            check_size(value, max_bytes)
        return orjson.dumps(_document(shape, topic, key, headers, value, timestamp_ms))
    except DecodeError:
        raise
    except Exception as exc:  # the barrier: what one message raised refuses that message
        detail = f"the Debezium message cannot be read: {type(exc).__name__}: {exc}"
        raise DecodeError(BAD_FORMAT, detail[:300], value) from exc


@dataclass(frozen=True, slots=True)
class Fields:
    """The outbox table's columns the router reads besides the placed ones (its defaults)."""

    id: str = "id"  # table.field.event.id
    key: str = "aggregateid"  # table.field.event.key
    payload: str = "payload"  # table.field.event.payload

    def columns(self, shape: Shape) -> list[str]:
        """Every column a message is built from, each named once."""
        wanted = [self.id, self.key, self.payload, shape.route_by_field, *shape.in_headers()]
        return list(dict.fromkeys(wanted))


@dataclass(frozen=True, slots=True)
class Message:
    """One message as the router writes it: where it goes, its key, value and headers."""

    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, str | bytes | None]]


def message(shape: Shape, fields: Fields, row: Mapping[str, Any]) -> Message:
    """The message Debezium's router writes for one outbox row (its columns by name).

    The payload column's JSON text is the value (as the string converter writes a jsonb
    payload); the placed columns are headers as text, as the router's header converter
    writes them (a NULL column has no header).
    """
    headers: list[tuple[str, str | bytes | None]] = [(ID_HEADER, str(row[fields.id]).encode())]
    for column in shape.in_headers():
        if row.get(column) is not None:
            headers.append((shape.header(column) or column, str(row[column]).encode()))
    payload = row[fields.payload]
    value = payload.encode() if isinstance(payload, str) else orjson.dumps(payload)
    return Message(
        shape.topic_for(str(row[shape.route_by_field])),
        str(row[fields.key]).encode(),
        value,
        headers,
    )
