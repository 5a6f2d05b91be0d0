"""CloudEvents on Kafka: an event as a binary-mode message, and any CloudEvent read back.

Binary mode (the relay's ``INORDER_ENVELOPE=cloudevents``): the value is the payload
(``content-type: application/json``) and the attributes are ``ce_`` headers:

- ``ce_id`` the event_id, ``ce_type`` the event_type, ``ce_time`` occurred_at;
- ``ce_source`` ``/inorder/<entity_type>``, ``ce_subject`` ``<entity_type>:<entity_id>``;
- ``ce_sequence``, the version as sortable text: generation and seq, 20 digits each;
- the extensions ``ce_inordergeneration``, ``ce_inorderseq`` (the two numbers) and
  ``ce_inorderpublished`` (published_at).

``envelope`` reads a CloudEvent in binary or structured mode (as written by any producer
that follows the Kafka binding and sets the two numbers, or a ``sequence`` of this
shape) into inorder's envelope, which the codec then checks as any other: nothing about
an event is trusted more for having come as a CloudEvent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from schemas.codec import (
    BAD_FORMAT,
    INVALID_UTF8,
    MAX_MESSAGE_BYTES,
    MISSING_FIELD,
    NOT_OBJECT,
    OUT_OF_RANGE,
    WRONG_TYPE,
    check_size,
    decode,
)
from schemas.errors import DecodeError
from schemas.event import Event
from schemas.limits import MAX_DEPTH, MAX_PAYLOAD_DEPTH, NOT_JSON, TOO_DEEP, text_problem

SPECVERSION = "1.0"
PREFIX = "ce_"
CONTENT_TYPE = "content-type"
JSON_TYPE = "application/json"
STRUCTURED_TYPE = "application/cloudevents+json"
# inorder's extension attributes (lower-case letters, at most 20 characters).
GENERATION = "inordergeneration"
SEQ = "inorderseq"
PUBLISHED = "inorderpublished"
_SEQUENCE = re.compile(r"(\d{1,20})-(\d{1,20})\Z")
# The largest version number: what the envelope and PostgreSQL's bigint hold.
MAX_NUMBER = 2**63 - 1
# The attributes that say which event this is and where it stands: the relay writes them
# and nothing else may (an outbox row's headers naming one are refused).
IDENTITY = frozenset(
    PREFIX + name
    for name in (
        "specversion", "id", "source", "type", "subject", "time", "sequence",
        GENERATION, SEQ, PUBLISHED,
    )
) | {CONTENT_TYPE}  # fmt: skip
# Reason code of a CloudEvent that says one attribute twice, two ways.
AMBIGUOUS = "ambiguous"

Header = tuple[str, str | bytes | None]
Headers = Sequence[Header] | Mapping[str, str | bytes | None]


def sequence(generation: int, seq: int) -> str:
    """The version as text that sorts as the versions do (20 digits each, a dash between)."""
    return f"{generation:020d}-{seq:020d}"


def source(entity_type: str) -> str:
    """The ``source`` of an entity stream's events."""
    return f"/inorder/{entity_type}"


def binary_headers(
    event_id: str,
    event_type: str,
    entity: tuple[str, str, int, int],
    occurred_at: str,
    published_at: str,
) -> list[tuple[str, bytes]]:
    """The ``ce_`` headers of one event in binary mode (``entity``: type, id, generation, seq)."""
    entity_type, entity_id, generation, seq = entity
    attributes = {
        "specversion": SPECVERSION,
        "id": event_id,
        "source": source(entity_type),
        "type": event_type,
        "subject": f"{entity_type}:{entity_id}",
        "time": occurred_at,
        "sequence": sequence(generation, seq),
        GENERATION: str(generation),
        SEQ: str(seq),
        PUBLISHED: published_at,
    }
    return [(PREFIX + k, v.encode()) for k, v in attributes.items()] + [
        (CONTENT_TYPE, JSON_TYPE.encode())
    ]


def envelope(
    headers: Headers | None, value: bytes | None, *, max_bytes: int = MAX_MESSAGE_BYTES
) -> bytes | None:
    """inorder's envelope (JSON) of the CloudEvent a message carries; None when it is none.

    ``DecodeError`` says why a message that is a CloudEvent cannot be one of inorder's;
    nothing else escapes, whatever the message holds.
    """
    try:
        return _translated(headers, value, max_bytes)
    except DecodeError:
        raise
    except Exception as exc:  # the barrier: what one message raised refuses that message
        detail = f"the CloudEvent cannot be translated: {type(exc).__name__}: {exc}"
        raise DecodeError(BAD_FORMAT, detail[:300], value) from exc


def _translated(headers: Headers | None, value: bytes | None, max_bytes: int) -> bytes | None:
    if value is not None:  # a value the codec refuses as too large is not translated either
        check_size(value, max_bytes)
    found = _headers(headers, value)
    content_type = found.get(CONTENT_TYPE, "").split(";")[0].strip().lower()
    if content_type == STRUCTURED_TYPE:
        attributes = _json(value, value)
        if not isinstance(attributes, dict):
            raise DecodeError(NOT_OBJECT, "a structured CloudEvent must be a JSON object", value)
        if "data_base64" in attributes:
            raise DecodeError(BAD_FORMAT, "data_base64: the payload must be a JSON object", value)
        data = attributes.get("data")
    elif PREFIX + "specversion" in found:
        attributes = {k[len(PREFIX) :]: v for k, v in found.items() if k.startswith(PREFIX)}
        if content_type not in ("", JSON_TYPE):
            raise DecodeError(BAD_FORMAT, f"content-type {content_type}: not JSON", value)
        data = _json(value, value) if value else None
    else:
        return None
    # orjson reads 1,024 levels but writes only 254: too deep is refused before writing.
    # Structured, the data sits one level inside the document, as in inorder's envelope.
    depth = MAX_DEPTH if content_type == STRUCTURED_TYPE else MAX_PAYLOAD_DEPTH
    deep = text_problem(value, "the CloudEvent's data", depth) if value else None
    if deep is not None:
        raise DecodeError(*deep, value)
    return orjson.dumps(_document(attributes, data, value))


def decode_message(
    value: bytes | None, headers: Headers | None, *, max_bytes: int = MAX_MESSAGE_BYTES
) -> tuple[Event, bytes]:
    """A Kafka message's event and its inorder envelope (what a step route parks).

    inorder's envelope is tried first, so its messages never have their headers read; a
    CloudEvent (binary or structured) is read into inorder's envelope and checked alike.
    ``DecodeError`` says why the message is neither.
    """
    try:
        return decode(value, max_bytes=max_bytes), value or b""
    except DecodeError:
        translated = envelope(headers, value, max_bytes=max_bytes)
        if translated is None:
            raise
    return decode(translated, max_bytes=max_bytes), translated


def _headers(headers: Headers | None, raw: bytes | None) -> dict[str, str]:
    found: dict[str, str] = {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        key = name.lower()
        if key != CONTENT_TYPE and not key.startswith(PREFIX):
            continue
        try:
            text = value.decode() if isinstance(value, bytes) else (value or "")
        except UnicodeDecodeError:
            raise DecodeError(INVALID_UTF8, f"header {name} is not UTF-8", raw) from None
        if found.setdefault(key, text) != text:
            detail = f"header {name[:40]} comes twice with different values: which one is meant?"
            raise DecodeError(AMBIGUOUS, detail, raw, key)
    return found


def _json(text: bytes | None, raw: bytes | None) -> Any:
    try:
        return orjson.loads(text or b"")
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "recursion" in str(exc).lower():
            detail = f"the CloudEvent nests deeper than {MAX_DEPTH} levels"
            raise DecodeError(TOO_DEEP, detail, raw) from None
        raise DecodeError(NOT_JSON, f"the CloudEvent's data is not JSON: {exc}", raw) from None


def _document(attributes: Mapping[str, Any], data: Any, raw: bytes | None) -> dict[str, Any]:
    """inorder's envelope fields from the CloudEvent's attributes (the codec checks them)."""
    if attributes.get("specversion") != SPECVERSION:
        raise DecodeError(
            BAD_FORMAT, f"specversion {attributes.get('specversion')!r}, not {SPECVERSION}", raw
        )
    for name in ("id", "type", "subject", "time"):
        if not isinstance(attributes.get(name), str):
            raise DecodeError(MISSING_FIELD, f"the CloudEvent has no {name}", raw, name)
    entity_type, colon, entity_id = attributes["subject"].partition(":")
    if not colon:
        raise DecodeError(BAD_FORMAT, "subject must be <entity_type>:<entity_id>", raw, "subject")
    generation, seq = _version(attributes, raw)
    return {
        "event_id": attributes["id"],
        "event_type": attributes["type"],
        "entity_type": entity_type,
        "entity_id": entity_id,
        "generation": generation,
        "seq": seq,
        "occurred_at": attributes["time"],
        "published_at": attributes.get(PUBLISHED) or attributes["time"],
        "payload": data,
    }


def _version(attributes: Mapping[str, Any], raw: bytes | None) -> tuple[Any, Any]:
    """(generation, seq) from the two extensions, else from a ``sequence`` of inorder's shape."""
    if SEQ in attributes:
        return whole_number(attributes.get(GENERATION, 1), GENERATION, raw), whole_number(
            attributes[SEQ], SEQ, raw
        )
    matched = _SEQUENCE.match(str(attributes.get("sequence", "")))
    if matched is None:
        raise DecodeError(
            MISSING_FIELD,
            f"the CloudEvent has no {SEQ} (nor a sequence <generation>-<seq>): nothing orders it",
            raw,
            SEQ,
        )
    return whole_number(int(matched[1]), "sequence", raw), whole_number(
        int(matched[2]), "sequence", raw
    )


def whole_number(value: Any, name: str, raw: bytes | None) -> Any:
    """A whole number as the codec will check it (a header's text, or JSON's number)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        detail = f"{name} must be a whole number, got {value!r:.40}"
        raise DecodeError(WRONG_TYPE, detail, raw, name)
    if value > MAX_NUMBER:
        raise DecodeError(OUT_OF_RANGE, f"{name} is past {MAX_NUMBER}: {value}", raw, name)
    return value
