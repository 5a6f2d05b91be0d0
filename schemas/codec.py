"""Envelope codec: orjson on the wire, checks compiled once from the envelope schema.

``decode`` never interprets the JSON Schema per message. At import, each envelope
property of the schema file becomes a check function that says exactly what is
wrong, and the same rules are also compiled into one straight-line function that
only answers "valid or not" and builds the event: the fast path every good message
takes. A message it refuses goes through the check functions for the precise
error. A schema keyword the codec cannot enforce fails the import, so the file and
the codec cannot drift apart silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from json.encoder import encode_basestring
from typing import Any

import orjson

from schemas.errors import DecodeError, SchemaDefinitionError
from schemas.event import Event
from schemas.files import ecma_pattern, envelope_schema
from schemas.limits import (  # the reason codes are the codec's too
    LONE_SURROGATE,
    MAX_DEPTH,
    NOT_JSON,
    NUL_IN_TEXT,  # noqa: F401
    TOO_DEEP,
    string_problem,
    value_problem,
)

# Larger messages are refused before parsing (1 MiB).
MAX_MESSAGE_BYTES = 1024 * 1024
# Distinct valid values remembered per patterned field (bounded: timestamps never repeat).
MEMO_SIZE = 4096

# A string as JSON text, quoted (the standard library's C escaper): control characters,
# quotes and backslashes escaped, everything else as it is, as orjson writes strings.
_escape: Callable[[str], str] = encode_basestring

# Reason codes: stable, low-cardinality, used as metric labels and DLQ headers.
EMPTY = "empty"
TOO_LARGE = "too_large"
INVALID_UTF8 = "invalid_utf8"
NOT_OBJECT = "not_object"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
OUT_OF_RANGE = "out_of_range"
BAD_LENGTH = "bad_length"
BAD_FORMAT = "bad_format"


class _Invalid(Exception):  # noqa: N818 - internal signal, never escapes this module
    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail


Check = Callable[[Any], Any]
_EVENT_FIELDS = tuple(f.name for f in fields(Event))
_DOC_KEYWORDS = frozenset({"description", "title", "$comment"})


def _string_check(spec: Mapping[str, Any]) -> Check:
    low = spec.get("minLength", 0)
    high = spec.get("maxLength")
    pattern = ecma_pattern(spec["pattern"]) if "pattern" in spec else None

    def check(value: Any) -> Any:
        if type(value) is not str:
            raise _Invalid(WRONG_TYPE, f"must be a string, not {_json_type(value)}")
        if len(value) < low or (high is not None and len(value) > high):
            raise _Invalid(BAD_LENGTH, f"length must be {low}..{high or 'any'}, is {len(value)}")
        if pattern is not None and pattern.search(value) is None:
            raise _Invalid(BAD_FORMAT, f"does not match {pattern.pattern}")
        return value

    return check


def _integer_check(spec: Mapping[str, Any]) -> Check:
    low = spec.get("minimum")
    high = spec.get("maximum")

    def check(value: Any) -> Any:
        # JSON has one number type: 3.0 is the integer 3. Booleans are not numbers.
        if type(value) is float and value.is_integer():
            value = int(value)
        if type(value) is not int:
            raise _Invalid(WRONG_TYPE, f"must be an integer, not {_json_type(value)}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise _Invalid(OUT_OF_RANGE, f"must be an integer in {low}..{high}, is {value}")
        return value

    return check


def _object_check(spec: Mapping[str, Any]) -> Check:
    def check(value: Any) -> Any:
        if type(value) is not dict:
            raise _Invalid(WRONG_TYPE, f"must be an object, not {_json_type(value)}")
        return value

    return check


_BUILDERS: dict[str, tuple[Callable[[Mapping[str, Any]], Check], frozenset[str]]] = {
    "string": (_string_check, frozenset({"type", "minLength", "maxLength", "pattern"})),
    "integer": (_integer_check, frozenset({"type", "minimum", "maximum"})),
    "object": (_object_check, frozenset({"type"})),
}


def _compile_field(name: str, spec: Mapping[str, Any], defs: Mapping[str, Any]) -> Check:
    if "$ref" in spec:
        spec = defs[spec["$ref"].removeprefix("#/$defs/")]
    builder, allowed = _BUILDERS.get(spec.get("type", ""), (None, frozenset()))
    unknown = set(spec) - allowed - _DOC_KEYWORDS
    if builder is None or unknown:
        raise SchemaDefinitionError(f"envelope field {name}: codec cannot enforce {spec}")
    return builder(spec)


def _compile_envelope() -> tuple[tuple[str, Check], ...]:
    schema = envelope_schema()
    defs = schema.get("$defs", {})
    properties = schema["properties"]
    if set(schema["required"]) != set(properties) or set(properties) != set(_EVENT_FIELDS):
        raise SchemaDefinitionError("envelope: required fields, properties and Event differ")
    return tuple((name, _compile_field(name, properties[name], defs)) for name in _EVENT_FIELDS)


_FIELDS = _compile_envelope()


def _resolved(name: str) -> Mapping[str, Any]:
    schema = envelope_schema()
    spec: Mapping[str, Any] = schema["properties"][name]
    if "$ref" in spec:
        spec = schema["$defs"][spec["$ref"].removeprefix("#/$defs/")]
    return spec


def field_limit(name: str, key: str) -> int:
    """An envelope field's bound from the schema file (``maxLength``, ``maximum``, ...)."""
    value = _bound(_resolved(name), key, None)
    if value is None:
        raise SchemaDefinitionError(f"envelope: {name} has no {key}")
    return value


def _bound(spec: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = spec.get(key, default)
    if value is not None and type(value) is not int:
        raise SchemaDefinitionError(f"envelope: {key} must be an integer, got {value!r}")
    return value


def _fast_lines(index: int, spec: Mapping[str, Any]) -> list[str]:
    """Straight-line code that leaves ``v<index>`` checked, or returns None."""
    v = f"v{index}"
    if spec["type"] == "object":
        return [f"    if type({v}) is not dict: return None"]
    if spec["type"] == "integer":
        low, high = _bound(spec, "minimum", None), _bound(spec, "maximum", None)
        bounds = " and ".join(
            [f"{low} <= {v}" if low is not None else "True"]
            + ([f"{v} <= {high}"] if high is not None else [])
        )
        return [
            f"    if type({v}) is float and {v}.is_integer(): {v} = int({v})",
            f"    if type({v}) is not int or not ({bounds}): return None",
        ]
    low, high = _bound(spec, "minLength", 0), _bound(spec, "maxLength", None)
    size = f"{low} <= len({v})" + (f" <= {high}" if high is not None else "")
    if "pattern" not in spec:
        return [f"    if type({v}) is not str or not ({size}): return None"]
    # A patterned field (event and entity types) takes few distinct values: one that
    # passed before is in the field's memo and skips the regex.
    return [
        f"    if type({v}) is not str: return None",
        f"    if {v} not in ok{index}:",
        f"        if not ({size}) or p{index}({v}) is None: return None",
        f"        if len(ok{index}) < {MEMO_SIZE}: ok{index}.add({v})",
    ]


def _build_lines(names: tuple[str, ...], env: dict[str, Any]) -> list[str]:
    """Lines that build the Event from v0.. without running its frozen ``__init__``.

    The frozen dataclass sets each field through ``object.__setattr__``; writing the
    slots directly builds the same object in half the time. Event has no
    ``__post_init__`` and no defaults, so nothing else ``__init__`` does is skipped.
    """
    env["new"] = object.__new__
    lines = ["    e = new(Event)"]
    for i, name in enumerate(names):
        env[f"s{i}"] = Event.__dict__[name].__set__  # the slot's own descriptor
        lines.append(f"    s{i}(e, v{i})")
    return [*lines, "    return e"]


def _compile_fast() -> Callable[[dict[str, Any]], Event | None]:
    names = _EVENT_FIELDS
    if hasattr(Event, "__post_init__") or not hasattr(Event, "__slots__"):
        raise SchemaDefinitionError("Event must be a slotted dataclass with no __post_init__")
    env: dict[str, Any] = {"Event": Event}
    source = ["def fast(doc):", "    try:"]
    source += [f"        v{i} = doc[{name!r}]" for i, name in enumerate(names)]
    source += ["    except KeyError:", "        return None"]
    for index, name in enumerate(names):
        spec = _resolved(name)
        if "pattern" in spec:
            env[f"p{index}"] = ecma_pattern(spec["pattern"]).search
            env[f"ok{index}"] = set()
        source += _fast_lines(index, spec)
    source += _build_lines(names, env)
    exec("\n".join(source), env)  # noqa: S102 - source built from the schema's own bounds
    fast: Callable[[dict[str, Any]], Event | None] = env["fast"]
    return fast


_FAST = _compile_fast()

# The shortest valid envelope (compact, every field at its least), and the least a valid
# one nesting past MAX_DEPTH can take: an opening and a closing bracket for each level
# beyond the envelope's own two (itself and its payload).
SHORTEST_ENVELOPE = len(
    orjson.dumps(
        {
            "event_id": "x",
            "event_type": "a",
            "entity_type": "a",
            "entity_id": "x",
            "generation": 1,
            "seq": 1,
            "occurred_at": "0000-00-00T00:00:00Z",
            "published_at": "0000-00-00T00:00:00Z",
            "payload": {},
        }
    )
)
_DEEP_BYTES = SHORTEST_ENVELOPE + 2 * (MAX_DEPTH - 1)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _parse(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        message = str(exc)
        if "UTF-8" in message:
            raise DecodeError(INVALID_UTF8, "value is not valid UTF-8", raw) from exc
        if "depth limit" in message or "recursion" in message.lower():
            raise DecodeError(TOO_DEEP, f"JSON nests deeper than {MAX_DEPTH} levels", raw) from exc
        if "surrogate" in message:
            detail = "value holds a lone surrogate, which is not Unicode text"
            raise DecodeError(LONE_SURROGATE, detail, raw) from exc
        raise DecodeError(NOT_JSON, f"value is not JSON ({message})", raw) from exc


_CHECKS = dict(_FIELDS)


def field_problem(name: str, value: Any) -> tuple[str, str] | None:
    """``(reason, detail)`` when ``value`` breaks the envelope rule for field ``name``."""
    try:
        _CHECKS[name](value)
    except _Invalid as bad:
        return bad.reason, f"{name} {bad.detail}"
    return string_problem(value, name) if type(value) is str else None


def check_size(raw: bytes, max_bytes: int) -> None:
    """``DecodeError`` (``too_large``) when a message's value is over the cap."""
    if len(raw) > max_bytes:
        raise DecodeError(TOO_LARGE, f"value is {len(raw)} bytes, over the {max_bytes} cap", raw)


def decode(raw: bytes | None, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Event:
    """Decode a Kafka value into an ``Event``; raise ``DecodeError`` saying exactly why not."""
    if not raw:
        raise DecodeError(EMPTY, "message has no value", raw)
    check_size(raw, max_bytes)
    doc = _parse(raw)
    if type(doc) is not dict:
        raise DecodeError(NOT_OBJECT, f"value is a JSON {_json_type(doc)}, not an object", raw)
    # A NUL escape, or more brackets than the depth limit in a message long enough to be
    # a valid envelope that deep: looked at closely. Inlined (``schemas.limits.suspect``
    # says the same): every byte scan costs, and this runs for every message.
    if b"\\u0000" in raw or (
        len(raw) > _DEEP_BYTES and raw.count(b"[") + raw.count(b"{") > MAX_DEPTH
    ):
        problem = value_problem(doc, where="value")
        if problem is not None:
            raise DecodeError(problem[0], problem[1], raw)
    event = _FAST(doc)
    if event is not None:
        return event
    values = []
    for name, check in _FIELDS:
        try:
            values.append(check(doc[name]))
        except KeyError:
            raise DecodeError(MISSING_FIELD, f"{name} is missing", raw, name) from None
        except _Invalid as bad:
            raise DecodeError(bad.reason, f"{name} {bad.detail}", raw, name) from None
    return Event(*values)


def to_document(event: Event) -> dict[str, Any]:
    """The envelope of ``event`` as a plain JSON-ready dict."""
    return {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "entity_type": event.entity_type,
        "entity_id": event.entity_id,
        "generation": event.generation,
        "seq": event.seq,
        "occurred_at": event.occurred_at,
        "published_at": event.published_at,
        "payload": event.payload,
    }


def encode(event: Event) -> bytes:
    """The envelope of ``event`` as compact JSON bytes."""
    return orjson.dumps(to_document(event))


def rendered_types(event_type: str, entity_type: str) -> str:
    """The envelope's event and entity type fields as JSON text, for ``encode_rendered``.

    Made once per pair of types and reused: a batch has few pairs and many events.
    """
    return f'"event_type":{_escape(event_type)},"entity_type":{_escape(entity_type)}'


def encode_rendered(
    event_id: str,
    types: str,
    entity: tuple[str, int, int],
    occurred_at: str,
    published_at: str,
    payload: str,
) -> bytes:
    """The envelope of an event whose timestamps and payload are already JSON text.

    ``types`` is what ``rendered_types`` makes of the event's types; ``entity`` is
    ``(entity_id, generation, seq)``; ``occurred_at``, ``published_at`` and ``payload``
    are JSON text (quoted timestamps, an object), as PostgreSQL renders an outbox row.
    They are spliced into the document, never parsed and serialised again; the result
    is what ``encode`` makes of the same event, field for field and in the same order
    (a property test holds the two together). The relay's hot path: the two free-text
    strings are escaped and everything is formatted into one string, several times
    faster than building a dict for orjson to serialise.
    """
    entity_id, generation, seq = entity
    return (
        f'{{"event_id":{_escape(event_id)},{types},"entity_id":{_escape(entity_id)},'
        f'"generation":{generation},"seq":{seq},"occurred_at":{occurred_at},'
        f'"published_at":{published_at},"payload":{payload}}}'
    ).encode()
