"""Mutated envelopes for the fuzz test, each with the outcome it must have (pure).

Every case is one Kafka message: a valid subscription event of an entity of its
own, or that event broken in one way whose dead-letter reason is known by
construction. ``APPLIED`` marks the ones the consumer must apply (unicode ids,
deeply nested but valid payloads, no Kafka key, the same event twice).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from consumer import deadletter
from consumer.kinds.projection.errors import PROJECTION_REJECTED
from schemas import Event, codec, to_document
from schemas.limits import MAX_DEPTH

APPLIED = "applied"
PLANS = ("free", "basic", "pro", "enterprise")
TWO_MIB = 2 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Case:
    """One message to send, and what must become of it."""

    fid: int
    key: bytes | None
    value: bytes | None
    expected: str
    kind: str


def valid_event(fid: int, entity: str | None = None) -> Event:
    """The valid subscription event of case ``fid``."""
    return Event(
        f"fz:{fid}",
        "subscription.plan_changed",
        "subscription",
        entity or f"fz-{fid}",
        1,
        1,
        "2026-11-30T10:00:00Z",
        "2026-11-30T10:00:01Z",
        {"plan": PLANS[fid % len(PLANS)], "price_cents": fid, "status": "active"},
    )


def _doc(fid: int) -> dict[str, Any]:
    return to_document(valid_event(fid))


def _with(field: str, value: Any) -> Callable[[int], bytes]:
    def make(fid: int) -> bytes:
        return orjson.dumps({**_doc(fid), field: value})

    return make


def _without(field: str) -> Callable[[int], bytes]:
    def make(fid: int) -> bytes:
        doc = _doc(fid)
        del doc[field]
        return orjson.dumps(doc)

    return make


def _payload(**changes: Any) -> Callable[[int], bytes]:
    def make(fid: int) -> bytes:
        doc = _doc(fid)
        doc["payload"] = {**doc["payload"], **changes}
        return orjson.dumps(doc)

    return make


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"d": value}
    return value


def _nested_raw(fid: int, depth: int) -> bytes:
    # Built as text: the JSON encoder refuses to nest this deep itself.
    doc = orjson.dumps({**_doc(fid), "payload": {**_doc(fid)["payload"], "deep": "@"}})
    return doc.replace(b'"@"', b'{"d":' * depth + b"0" + b"}" * depth)


def _escaped(field: str, escape: str) -> Callable[[int], bytes]:
    """The field's text with a JSON escape put in front, as raw JSON (orjson writes none)."""

    def make(fid: int) -> bytes:
        text = orjson.dumps(_doc(fid))
        value = orjson.dumps(_doc(fid)[field])
        return text.replace(value, b'"' + escape.encode() + value[1:], 1)

    return make


def _bad_utf8(sequence: bytes) -> Callable[[int], bytes]:
    def make(fid: int) -> bytes:
        return orjson.dumps(_doc(fid)).replace(b'"fz-', b'"' + sequence + b"fz-", 1)

    return make


def _truncated(rng: random.Random) -> Callable[[int], bytes]:
    def make(fid: int) -> bytes:
        raw = orjson.dumps(_doc(fid))
        return raw[: rng.randint(1, len(raw) - 1)]

    return make


def _unicode(fid: int) -> bytes:
    return orjson.dumps({**_doc(fid), "entity_id": f"fz-{fid}-Zürich-東京-🚀-\u200b"})


def kinds(rng: random.Random) -> dict[str, tuple[Callable[[int], bytes | None], str]]:
    """Mutation name -> (value for case fid, expected outcome)."""
    r = codec
    return {
        "empty value": (lambda _: b"", r.EMPTY),
        "no value (tombstone)": (lambda _: None, r.EMPTY),
        "truncated": (_truncated(rng), r.NOT_JSON),
        "garbage bytes": (lambda fid: b"\x00\x01\x02" + str(fid).encode(), r.NOT_JSON),
        "infinite number": (
            lambda fid: orjson.dumps(_doc(fid)).replace(b'"seq":1', b'"seq":1e400'),
            r.NOT_JSON,
        ),
        "invalid UTF-8": (_bad_utf8(b"\xff\xfe"), r.INVALID_UTF8),
        "lone surrogate": (_bad_utf8(b"\xed\xa0\x80"), r.INVALID_UTF8),
        "overlong UTF-8": (_bad_utf8(b"\xc0\xaf"), r.INVALID_UTF8),
        "nested too deep": (lambda fid: _nested_raw(fid, 1100), r.TOO_DEEP),
        **{
            f"payload nested {depth} deep": (lambda fid, d=depth: _nested_raw(fid, d), r.TOO_DEEP)
            for depth in (MAX_DEPTH, 200, 253, 254, 1023, 1025)
        },
        "entity_id with NUL": (_with("entity_id", "fz-\x00"), r.NUL_IN_TEXT),
        "event_id with NUL": (_with("event_id", "\x00"), r.NUL_IN_TEXT),
        "payload value with NUL": (_payload(plan="pro\x00"), r.NUL_IN_TEXT),
        "payload key with NUL": (_payload(**{"k\x00": 1}), r.NUL_IN_TEXT),
        "escaped lone surrogate": (_escaped("entity_id", "\\ud800"), r.LONE_SURROGATE),
        "escaped lone low surrogate": (_escaped("event_id", "\\udc00"), r.LONE_SURROGATE),
        "generation 2^63": (_with("generation", 2**63), r.OUT_OF_RANGE),
        "entity_id one past the longest": (_with("entity_id", "x" * 257), r.BAD_LENGTH),
        "array": (lambda fid: orjson.dumps([_doc(fid)]), r.NOT_OBJECT),
        "number": (lambda fid: str(fid).encode(), r.NOT_OBJECT),
        "null": (lambda _: b"null", r.NOT_OBJECT),
        "string": (lambda fid: orjson.dumps(f"fz-{fid}"), r.NOT_OBJECT),
        **{
            f"missing {f}": (_without(f), r.MISSING_FIELD)
            for f in (
                "event_id",
                "entity_type",
                "entity_id",
                "seq",
                "generation",
                "payload",
                "occurred_at",
            )
        },
        "seq as string": (_with("seq", "5"), r.WRONG_TYPE),
        "seq as fraction": (_with("seq", 1.5), r.WRONG_TYPE),
        "seq as boolean": (_with("seq", True), r.WRONG_TYPE),
        "seq null": (_with("seq", None), r.WRONG_TYPE),
        "entity_id as number": (_with("entity_id", 123), r.WRONG_TYPE),
        "payload as list": (_with("payload", [1, 2]), r.WRONG_TYPE),
        "payload as string": (_with("payload", "{}"), r.WRONG_TYPE),
        "timestamp as number": (_with("occurred_at", 0), r.WRONG_TYPE),
        "seq zero": (_with("seq", 0), r.OUT_OF_RANGE),
        "seq negative": (_with("seq", -1), r.OUT_OF_RANGE),
        "seq most negative": (_with("seq", -(2**63)), r.OUT_OF_RANGE),
        "generation zero": (_with("generation", 0), r.OUT_OF_RANGE),
        "seq 2^63": (_with("seq", 2**63), r.OUT_OF_RANGE),
        "seq beyond 64 bits": (
            lambda fid: orjson.dumps(_doc(fid)).replace(
                b'"seq":1', b'"seq":' + str(10**30).encode()
            ),
            r.OUT_OF_RANGE,
        ),
        "entity_id empty": (_with("entity_id", ""), r.BAD_LENGTH),
        "entity_id too long": (_with("entity_id", "x" * 300), r.BAD_LENGTH),
        "event_id empty": (_with("event_id", ""), r.BAD_LENGTH),
        "entity_type upper case": (_with("entity_type", "Subscription"), r.BAD_FORMAT),
        "entity_type with colon": (_with("entity_type", "sub:scription"), r.BAD_FORMAT),
        "event_type with space": (_with("event_type", "plan changed"), r.BAD_FORMAT),
        "timestamp not a date": (_with("occurred_at", "yesterday"), r.BAD_FORMAT),
        "2 MiB value": (lambda fid: b"{" + b" " * TWO_MIB + b"}", r.TOO_LARGE),
        "2 MiB payload": (_payload(blob="x" * TWO_MIB), r.TOO_LARGE),
        "stream without route": (_with("entity_type", "no_such_stream"), deadletter.UNKNOWN_STREAM),
        "price not a number": (_payload(price_cents="lots"), PROJECTION_REJECTED),
        "price beyond integer": (_payload(price_cents=2**40), PROJECTION_REJECTED),
    }


VALID: dict[str, Callable[[int], bytes]] = {
    "valid": lambda fid: orjson.dumps(_doc(fid)),
    "valid, unicode ids": _unicode,
    # The envelope and the payload are two levels: the deepest a document may nest.
    "valid, payload nested to the limit": lambda fid: orjson.dumps(
        {**_doc(fid), "payload": {**_doc(fid)["payload"], "deep": _nested(MAX_DEPTH - 2)}}
    ),
    "valid, control characters": _payload(plan="pro", note="\x01\x1f\x7f tab\t"),
    "valid, unknown extra fields": lambda fid: orjson.dumps({**_doc(fid), "extra": {"x": [1]}}),
}
# Kinds that are costly to send: kept to a handful per run.
RARE = {"2 MiB value": 10, "2 MiB payload": 10}


def cases(mutated: int, valid: int, seed: int) -> list[Case]:
    """``mutated`` broken messages and ``valid`` good ones, shuffled together."""
    rng = random.Random(seed)
    broken = kinds(rng)
    common = [k for k in broken if k not in RARE]
    names = [k for k, n in RARE.items() for _ in range(n)]
    names += [rng.choice(common) for _ in range(mutated - len(names))]
    out: list[Case] = []
    for name in names:
        make, expected = broken[name]
        fid = len(out)
        out.append(Case(fid, f"subscription:fz-{fid}".encode(), make(fid), expected, name))
    for i in range(valid):
        fid = len(out)
        name = list(VALID)[i % len(VALID)]
        key = None if i % 7 == 0 else f"subscription:fz-{fid}".encode()  # some with no key
        out.append(Case(fid, key, VALID[name](fid), APPLIED, name if key else "valid, no key"))
    duplicates = [c for c in out if c.expected == APPLIED][: valid // 20]
    rng.shuffle(out)
    return out + [Case(c.fid, c.key, c.value, APPLIED, "valid, sent twice") for c in duplicates]
