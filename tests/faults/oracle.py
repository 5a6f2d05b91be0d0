"""What inorder should do with one fuzzed input, worked out apart from the code under test.

The oracle reads only the published contracts: the JSON Schema files, checked by the
pure-Python ``jsonschema`` validator (inorder uses a compiled one, and its codec none);
the limits the README states (nesting of 128 levels, no NUL, no lone surrogate, numbers
a double holds, a 1 MiB message; an integer past 64 bits is read as the nearest double);
and the routes of the fuzz pipeline.
It parses with the standard ``json`` module, which keeps integers of any size exactly,
where inorder parses with orjson. None of inorder's own modules is imported.

An ``Expect`` says which outcomes are right for one input: taken (applied, parked or
set aside without a dead letter) and/or refused with one of some reasons. Where the
contract alone cannot tell (a payload its schema refuses meets a route that does not
read schemas, a handler meets a value its table's column cannot hold), both are right,
and the reason a refusal must carry is still fixed.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"
MAX_DEPTH = 128
MAX_BYTES = 1024 * 1024
# The routes of the fuzz pipeline, by stream.
ROUTES = {"subscription": "projection", "seat_ledger": "step", "batch": "batch"}
HANDLED = {"seat_ledger.opened", "seat_ledger.seats_added"}
PROJECTED = {"subscription.created", "subscription.plan_changed"}
# The schema keyword an envelope breaks -> the reason its refusal names.
KEYWORDS = {
    "required": "missing_field",
    "type": "wrong_type",
    "minimum": "out_of_range",
    "maximum": "out_of_range",
    "minLength": "bad_length",
    "maxLength": "bad_length",
    "pattern": "bad_format",
}


@dataclass(frozen=True)
class Expect:
    """The right outcomes for one input."""

    reasons: frozenset[str] = frozenset()  # a refusal must name one of these
    taken: bool = False  # taken without a dead letter is right too
    applied: bool = False  # its effect must show (an unchanged, well-formed event)

    @property
    def label(self) -> str:
        """How the fuzzer's table names this expectation."""
        refused = "|".join(sorted(self.reasons))
        if not refused:
            return "applied" if self.applied else "taken"
        return f"taken or {refused}" if self.taken else refused

    def judge(self, letters: list[str]) -> str | None:
        """What is wrong with the dead letters one input got, or None."""
        if not letters:
            return None if self.taken else f"expected {self.label}, got no dead letter"
        wrong = [r for r in letters if r not in self.reasons]
        return f"expected {self.label}, dead-lettered {wrong}" if wrong else None


def taken(*, applied: bool = False) -> Expect:
    """Taken, not refused."""
    return Expect(taken=True, applied=applied)


def refused(*reasons: str) -> Expect:
    """Refused with one of ``reasons``."""
    return Expect(frozenset(reasons))


def either(*reasons: str) -> Expect:
    """Taken, or refused with one of ``reasons``."""
    return Expect(frozenset(reasons), taken=True)


# ------------------------------------------------------------------ the envelope


def event(raw: bytes | None, *, unchanged: bool = False) -> Expect:
    """The right outcomes for one Kafka value sent to the fuzz pipeline's consumers."""
    if not raw:
        return refused("empty")
    if len(raw) > MAX_BYTES:
        return refused("too_large")
    problems = set(_text_problems(raw))
    doc = _parse(raw, problems)
    if doc is _UNREAD:  # what the text's escapes say is wrong is right too
        return refused(*problems, *_escaped_problems(raw))
    problems |= set(_value_problems(doc))
    if not isinstance(doc, dict):
        return refused("not_object", *problems)
    problems |= {
        KEYWORDS.get(e.validator, e.validator) for e in _errors("envelope.schema.json", doc)
    }
    if problems:
        return refused(*problems)
    return _routed(doc, unchanged)


def _routed(doc: Mapping[str, Any], unchanged: bool) -> Expect:
    """A well-formed envelope meets its route."""
    kind = ROUTES.get(doc["entity_type"])
    event_type, payload = doc["event_type"], doc["payload"]
    valid = _payload_valid(event_type, payload)
    if kind is None:
        return refused("unknown_stream")
    if kind == "batch":
        if event_type == "batch.assembled":
            return taken()  # the route's own output read back: set aside
        if event_type != "batch.accepted" or not valid:
            return refused("batch_rejected")
        return either("batch_rejected")  # a batch id or count the manifest rules refuse
    reason = "projection_rejected" if kind == "projection" else "step_failed"
    wanted = PROJECTED if kind == "projection" else HANDLED
    if valid and event_type in wanted and _small(payload):
        return taken(applied=unchanged)
    return either(reason)


def _payload_valid(event_type: str, payload: Any) -> bool:
    path = f"payloads/{event_type}.schema.json"
    return (SCHEMAS / path).is_file() and not list(_errors(path, payload))


def _small(value: Any) -> bool:
    """Every number fits a PostgreSQL ``integer`` and every string is short."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int | float):  # 2.0 is an integer to JSON Schema, 1e308 too
        return -(2**31) <= value < 2**31
    if isinstance(value, str):
        return len(value) <= 256
    if isinstance(value, dict):
        return all(_small(v) for v in value.values())
    if isinstance(value, list):
        return all(_small(v) for v in value)
    return True


# ------------------------------------------------------------------ limits, read apart


_UNREAD = object()


def _parse(raw: bytes, problems: set[str]) -> Any:
    """The document, exactly; ``_UNREAD`` (with a problem added) when it is not JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        problems.add("invalid_utf8")
        return _UNREAD
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        problems.add("too_deep")
    except ValueError:
        if not problems:
            problems.add("not_json")
    return _UNREAD


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _text_problems(raw: bytes) -> Iterator[str]:
    """Nesting past the limit, counted on the text (no parser needed)."""
    depth = deepest = 0
    quoted = escaped = False
    for byte in raw:
        if quoted:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                quoted = False
        elif byte == 0x22:
            quoted = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    if deepest > MAX_DEPTH:
        yield "too_deep"


def _value_problems(value: Any) -> Iterator[str]:
    """A NUL or lone surrogate in any string or key, a number no 64-bit reader holds."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield from _string_problems(item)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not _double(item):
                yield "not_json"
        elif isinstance(item, float):
            if not math.isfinite(item):
                yield "not_json"
        elif isinstance(item, dict):
            for key, child in item.items():
                yield from _string_problems(key)
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)


def _double(number: int) -> bool:
    """Whether an integer past 64 bits has a nearest double (what it is then read as)."""
    try:
        float(number)
    except OverflowError:
        return False
    return True


_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPES = {
    "nul_in_text": re.compile(rb"\\u0000"),
    "lone_surrogate": re.compile(rb"\\u[dD][89a-fA-F]"),
}


def _escaped_problems(raw: bytes) -> Iterator[str]:
    """Problems escapes in text no parser could read may stand for."""
    return (reason for reason, escape in _ESCAPES.items() if escape.search(raw))


def _string_problems(text: str) -> Iterator[str]:
    if "\x00" in text:
        yield "nul_in_text"
    if _SURROGATE.search(text):
        yield "lone_surrogate"


# ------------------------------------------------------------------ schemas


def _ecma_pattern(checker: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    """ECMA-262's ``$`` ends the string; Python's also matches before a final newline."""
    if isinstance(instance, str) and not re.search(pattern.replace("$", r"\Z"), instance):
        yield ValidationError(f"{instance[:40]!r} does not match {pattern!r}")


_Validator = validators.extend(Draft202012Validator, {"pattern": _ecma_pattern})


@cache
def _validator(path: str) -> Any:
    return _Validator(json.loads((SCHEMAS / path).read_text()))


def _errors(path: str, doc: Any) -> Iterator[ValidationError]:
    """The schema's complaints about ``doc``, nested ones (under ``$ref``) flattened."""
    for error in _validator(path).iter_errors(doc):
        yield from _leaves(error)


def _leaves(error: ValidationError) -> Iterator[ValidationError]:
    if error.context:
        for child in error.context:
            yield from _leaves(child)
    else:
        yield error


def protocol_valid(name: str, raw: bytes) -> bool:
    """Whether a republish request or result (``name``) is what its schema and limits allow."""
    problems = set(_text_problems(raw))
    doc = _parse(raw, problems)
    if doc is _UNREAD or problems or list(_value_problems(doc)):
        return False
    if list(_errors(f"{name}.schema.json", doc)):
        return False
    # A request names the range from_seq..to_seq (its schema's description): never empty.
    return name != "republish_request" or doc["from_seq"] <= doc["to_seq"]


# ------------------------------------------------------------------ routes files

# The fuzz routes files' valid values: the fuzz pipeline's table and its key column.
TABLE, KEY = "billing_view", "subscription_id"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_STREAM = re.compile(r"^[a-z][a-z0-9_]{0,62}\Z")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}\Z")


def routes_file(text: str) -> frozenset[str]:
    """The right outcomes of starting a consumer on one fuzzed routes file: ``started``
    and/or ``refused`` (exit 2, one line). What the routes file's documentation does not
    bound (other streams, numbers past the defaults, topics yet to be made) may go either
    way; what it does bound may not."""
    try:
        route = tomllib.loads(text)["route"][0]
    except (tomllib.TOMLDecodeError, KeyError, IndexError, TypeError):
        return frozenset({"refused"})
    problems, unsure = _route_problems(route)
    if problems:
        return frozenset({"refused"})
    return frozenset({"started", "refused"}) if unsure else frozenset({"started"})


def _route_problems(route: dict[str, Any]) -> tuple[bool, bool]:
    """Whether the route breaks a stated rule, and whether it leaves what is stated."""
    stream = route.get("stream")
    rules = _KINDS.get(route.get("kind"))
    if not isinstance(stream, str) or not _STREAM.match(stream) or rules is None:
        return True, False  # a stream is an entity_type; the kinds are three
    broken, unsure = rules(route)
    return broken, unsure or stream != "subscription"


def _projection(route: dict[str, Any]) -> tuple[bool, bool]:
    """The table must exist and the key be its unique column: only the pipeline's are; each
    column has one part (the key, the entity type, a version, or one field)."""
    columns = route.get("columns")
    paths = isinstance(columns, dict) and all(
        isinstance(c, str) and _IDENTIFIER.match(c) and _field_path(p) for c, p in columns.items()
    )
    parts = [
        route.get("key"),
        route.get("entity_type_column"),
        route.get("generation_column", "generation"),
        route.get("seq_column", "seq"),
    ]
    named = [p for p in parts if p is not None]
    twice = len(set(named)) < len(named) or (paths and bool(set(named) & set(columns)))
    return route.get("table") != TABLE or route.get("key") != KEY or not paths or twice, False


def _batch(route: dict[str, Any]) -> tuple[bool, bool]:
    """Topics must be legal names (made or not yet), a retry count a whole number."""
    topics = (route.get("output_topic"), route.get("work_topic"))
    legal = all(isinstance(t, str) and _TOPIC.match(t) and t not in (".", "..") for t in topics)
    return not legal or not _whole(route.get("max_retries")), True


def _step(route: dict[str, Any]) -> tuple[bool, bool]:
    """A parking cap is a whole number; handler keys and bounds are left open."""
    return not _whole(route.get("max_parked")), True


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_KINDS = {"projection": _projection, "batch": _batch, "step": _step}


def _field_path(path: Any) -> bool:
    """A payload field: a dotted path of non-empty names."""
    return isinstance(path, str) and bool(path) and "" not in path.split(".")
