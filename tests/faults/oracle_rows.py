"""What the outbox table and then the relay should do with one row written by plain SQL.

Worked out apart from the code under test, from the published contract: the outbox's
columns and rules as the producer README states them (types, CHECKs, the rules the
table holds a row to when it is written, the two unique keys), PostgreSQL's documented
conversions of bound values, and the relay's reasons for failing a row as its README
states them (schema, nesting, what the consumers' parser cannot read, a missing topic).
The JSON Schema files are read by the pure-Python validator of ``oracle``.

An outcome is written as the fuzzer records it: ``table: <exception class>`` (or
``table: client refused``, a value the client library will not send), ``relay: <reason>``
or ``sent``. ``OutboxTable.expect`` gives the outcomes that are right for the next row
and remembers the keys of the rows it expects written, so a repeated key is expected to
be refused as the unique index refuses it.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.faults import oracle

TEST_SCHEMAS = Path(__file__).resolve().parents[1] / "payload_schemas"
COLUMNS = ("topic", "entity_type", "entity_id", "generation", "seq", "event_type", "event_id")
BIGINT = ("generation", "seq")
BIGINT_RANGE = (-(2**63), 2**63 - 1)
# PostgreSQL's integer input: optional blanks and sign around decimal digits (server 15).
INTEGER_TEXT = re.compile(r"^[ \t\n\r\f\v]*[+-]?[0-9]+[ \t\n\r\f\v]*$")
TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}\Z")
ENTITY_TYPE = re.compile(r"^[a-z][a-z0-9_]{0,62}\Z")
EVENT_TYPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*\Z")
HEADERS_MAX = 65536
# numeric holds up to 131,072 digits before the point; a longer number overflows it.
NUMERIC_DIGITS = 131072


def table(name: str) -> str:
    """The outcome of an INSERT refused with the exception ``name``."""
    return f"table: {name}"


def relay(reason: str) -> str:
    """The outcome of a row the relay marked failed with ``reason``."""
    return f"relay: {reason}"


SENT = "sent"


@dataclass
class OutboxTable:
    """The rows the oracle expects written so far, by their unique keys."""

    topics: frozenset[str]  # the topics the cluster has
    keys: set[tuple[Any, ...]] = field(default_factory=set)
    event_ids: set[str] = field(default_factory=set)

    def expect(self, values: tuple[Any, ...]) -> frozenset[str]:
        """The outcomes that are right for a row of these values (see ``boundary_inputs``)."""
        refusals = _table_refusals(values)
        if refusals:
            return frozenset(table(name) for name in refusals)
        named = dict(zip(COLUMNS, values, strict=False))
        text = {c: _as_text(named[c]) for c in COLUMNS if c not in BIGINT}
        # A snapshot may share its version with the change event of that version.
        snapshot = text["event_type"] == f"{text['entity_type']}.snapshot"
        key = (
            text["entity_type"],
            text["entity_id"],
            *(_as_bigint(named[c]) for c in BIGINT),
            snapshot,
        )
        if key in self.keys or text["event_id"] in self.event_ids:
            return frozenset({table("UniqueViolation")})
        self.keys.add(key)
        self.event_ids.add(text["event_id"])
        return self._relayed(text, values[7])

    def _relayed(self, text: dict[str, str], payload_text: str) -> frozenset[str]:
        """A written row meets the relay."""
        payload = _json(payload_text)
        reasons = set()
        if text["topic"] not in self.topics:
            reasons.add("unknown_topic")
        event_type = text["event_type"]
        schema = _schema(event_type)
        if schema is None:
            reasons.add("unknown_type")
        elif _breaks(schema, payload):
            reasons.add("payload_schema")
        if _depth(payload) + 1 > oracle.MAX_DEPTH:  # the envelope is one level more
            reasons.add("too_deep")
        if _unreadable(payload):
            reasons |= {"out_of_range", "not_json"}
        if len(payload_text.encode()) > oracle.MAX_BYTES:
            reasons.add("too_large")
        if not reasons:
            return frozenset({SENT})
        return frozenset(relay(reason) for reason in reasons)


# ------------------------------------------------------------------ the INSERT


def _table_refusals(values: tuple[Any, ...]) -> set[str]:
    """What the INSERT is refused with, stage by stage; empty when it is written.

    The client sends nothing it cannot encode; PostgreSQL then plans the statement
    (types that have no assignment cast), converts the bound values, runs the row
    trigger (the rules a row is held to when written), and checks NOT NULL, the CHECKs
    and the unique keys. The first stage with a problem refuses the row; which of its
    problems is reported first is the server's to choose.
    """
    named = dict(zip(COLUMNS, values, strict=False))
    payload_text, headers_text = values[7], values[8]
    texts = [v for v in values if isinstance(v, str)]
    if any("\x00" in t or oracle._SURROGATE.search(t) for t in texts):
        return {"client refused"}
    if any(isinstance(named[c], bool) for c in BIGINT):
        return {"DatatypeMismatch"}
    converting = set()
    for column in BIGINT:
        converting |= _bigint_problems(named[column])
    for text in (payload_text, headers_text):
        converting |= _jsonb_problems(text)
    if converting:
        return converting
    payload, headers = _json(payload_text), _json(headers_text)
    topic = _as_text(named["topic"])
    if (
        not TOPIC.match(topic)
        or topic in (".", "..")
        or len(headers_text.encode()) > HEADERS_MAX
        or not (isinstance(headers, dict) and all(isinstance(v, str) for v in headers.values()))
    ):
        return {"CheckViolation"}
    return _constraint_problems(named, payload, headers)


def _constraint_problems(named: dict[str, Any], payload: Any, headers: Any) -> set[str]:
    """NOT NULL and the CHECKs of the table itself."""
    found = set()
    if any(named[c] is None for c in COLUMNS if c != "topic"):
        found.add("NotNullViolation")
    text = {c: _as_text(named[c]) for c in COLUMNS if c not in BIGINT and named[c] is not None}
    checks = [
        "topic" in text and not 1 <= len(text["topic"]) <= 249,
        "entity_type" in text and not ENTITY_TYPE.match(text["entity_type"]),
        "entity_id" in text and not 1 <= len(text["entity_id"]) <= 256,
        "event_type" in text
        and not (len(text["event_type"]) <= 128 and EVENT_TYPE.match(text["event_type"])),
        "event_id" in text and not 1 <= len(text["event_id"]) <= 256,
        any(named[c] is not None and _as_bigint(named[c]) < 1 for c in BIGINT),
        not isinstance(payload, dict),
        not isinstance(headers, dict),
    ]
    if any(checks):
        found.add("CheckViolation")
    return found


def _bigint_problems(value: Any) -> set[str]:
    if value is None:
        return set()
    if isinstance(value, str):
        if not INTEGER_TEXT.match(value):
            return {"InvalidTextRepresentation"}
        number = int(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            return {"NumericValueOutOfRange"}
        number = round(value)  # rint: halves to even, as round does
    else:
        number = value
    lowest, highest = BIGINT_RANGE
    return set() if lowest <= number <= highest else {"NumericValueOutOfRange"}


def _as_bigint(value: Any) -> int:
    if isinstance(value, str):
        return int(value)
    if isinstance(value, float):
        return round(value)
    return int(value)


def _as_text(value: Any) -> str:
    """A bound value as a text column holds it (an assignment cast through its output)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _float_text(value)
    return str(value)


def _float_text(value: float) -> str:
    """A double as PostgreSQL writes it: its shortest digits, with an exponent outside
    1e-4 .. 1e15 (``1e+15``, ``1.5e-05``), plainly inside (``1``, ``0.001``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    exact = Decimal(repr(value)).normalize()
    sign, digits, exponent = exact.as_tuple()
    assert isinstance(exponent, int)
    power = len(digits) + exponent - 1
    if -4 <= power < 15:
        return format(exact, "f")
    head = "".join(map(str, digits))
    mantissa = head[0] + (f".{head[1:]}" if len(head) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"


# ------------------------------------------------------------------ jsonb


class _OverflowError(ValueError):
    """A number numeric cannot hold."""


def _jsonb_problems(text: str) -> set[str]:
    """What PostgreSQL's jsonb input refuses in ``text``."""
    if re.search(r"(?<!\\)(\\\\)*\\u0000", text):
        return {"UntranslatableCharacter"}
    try:
        value = _json(text)
    except _OverflowError:
        return {"NumericValueOutOfRange"}
    except ValueError:
        return {"InvalidTextRepresentation"}
    # An escaped surrogate must be one of a pair; json reads a lone one, jsonb does not.
    strings = (leaf for leaf in _leaves(value) if isinstance(leaf, str))
    if any(oracle._SURROGATE.search(leaf) for leaf in strings):
        return {"InvalidTextRepresentation"}
    return set()


@contextmanager
def _deep() -> Iterator[None]:
    """Room for the recursion a document nested past a thousand levels takes to read."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def _json(text: str) -> Any:
    """The JSON text parsed as jsonb reads it: any depth, numbers as exact decimals."""
    with _deep():
        return json.loads(
            text,
            parse_constant=oracle._no_constant,
            parse_int=_number,
            parse_float=_number,
            object_pairs_hook=_object,
        )


def _breaks(schema: str, payload: Any) -> bool:
    """Whether the payload breaks its event type's schema."""
    with _deep():
        return bool(list(oracle._errors(schema, payload)))


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    for key, _ in pairs:
        if oracle._SURROGATE.search(key):
            raise ValueError("a lone surrogate in a key")
    return dict(pairs)


def _number(token: str) -> Any:
    mantissa, _, exponent = token.lower().partition("e")
    whole = mantissa.lstrip("-").split(".")[0].lstrip("0")
    power = int(exponent) if exponent else 0
    if len(whole) + power > NUMERIC_DIGITS:
        raise _OverflowError(token)
    if not exponent and "." not in mantissa and len(whole) < 4000:
        return int(token)
    try:
        return float(token)
    except OverflowError:
        return math.inf


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _unreadable(value: Any) -> bool:
    """A number no double holds, or a string jsonb keeps that no reader takes."""
    return any(_bad_leaf(leaf) for leaf in _leaves(value))


def _bad_leaf(leaf: Any) -> bool:
    if isinstance(leaf, float):
        return not math.isfinite(leaf)
    if isinstance(leaf, int) and not isinstance(leaf, bool):
        return not oracle._double(leaf)
    if isinstance(leaf, str):
        return oracle._SURROGATE.search(leaf) is not None
    return False


def _leaves(value: Any) -> Iterator[Any]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            yield item


def _schema(event_type: str) -> str | None:
    """The payload schema of an event type (inorder's own or the tests' folder), if any."""
    own = oracle.SCHEMAS / "payloads" / f"{event_type}.schema.json"
    if own.is_file():
        return f"payloads/{event_type}.schema.json"
    theirs = TEST_SCHEMAS / f"{event_type}.schema.json"
    return f"../../tests/payload_schemas/{event_type}.schema.json" if theirs.is_file() else None
