"""Inputs for the boundary fuzzer: documents drawn from the JSON Schemas, pushed to the edges.

Hypothesis draws documents that the schema files call valid (the envelope with the
payload of its event type, the republish request and result, the batch messages).
Each is then, most of the time, changed in one place to a value at the edge of what
PostgreSQL, orjson, the standard ``json`` module and the column types accept: NUL
and other control characters, lone surrogates, the longest allowed strings and one
more, nesting at and past every serializer's limit, integers at +-2^31, 2^53, 2^63 and
past them, floats where integers belong, empty and huge arrays.

Values no serializer would write (a lone surrogate, nesting past 254, an integer past
64 bits) are held in the document as markers and spliced into the JSON text by
``render``, which is how a hostile producer would send them.

Hypothesis also draws constants it finds in the modules a process has loaded, so the
same seed draws other documents in a process that loaded more. Every drawing function
therefore runs in a fresh interpreter that loads this module alone: a run of the whole
suite, a run of one test and a call from a shell all draw the same inputs.
"""

from __future__ import annotations

import copy
import functools
import os
import pickle
import random
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import orjson
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from schemas.files import ecma_pattern, json_schema, payload_schemas
from schemas.limits import MAX_DEPTH
from schemas.outbox.events import COLUMNS

_MARK = "\ue000"
STORABLE = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")


def _lone(code: str) -> str:
    return f"{_MARK}L{code}{_MARK}"


def _deep(levels: int) -> str:
    return f"{_MARK}D{levels}{_MARK}"


def _number(text: str) -> str:
    return f"{_MARK}N{text}{_MARK}"


EDGE_STRINGS = [
    "",
    "\x00",
    "a\x00b",
    "\x01\x08\x0b\x1f\x7f",
    "\t\n\r",
    "x" * 128,
    "x" * 129,
    "x" * 256,
    "x" * 257,
    "x" * 1024,
    "x" * 1025,
    "é" * 256,
    "🚀" * 64,
    "'; DROP TABLE outbox; --",
    _lone("ud800"),
    _lone("udfff"),
    "a:b",
]
EDGE_INTEGERS = [
    0,
    -1,
    1,
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**53,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    2**64 - 1,
    _number(str(-(2**63) - 1)),
    _number(str(2**64)),
    _number("1" + "0" * 30),
]
EDGE_FLOATS = [1.5, 2.0**31 + 0.5, 2.0**53, 1e308, -0.0, _number("1e400")]
EDGE_NESTING = [MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, 200, 253, 254, 1023, 1025]
EDGE_OTHER: list[Any] = [None, True, False, [], {}, list(range(2000)), [{}] * 500]


def _fresh(value: Any) -> Any:
    """A deep copy: a document is changed in place, and drawn ones are shared."""
    return copy.deepcopy(value)


def edge_value(rng: random.Random) -> Any:
    """One value from the edges of every type (a copy of its own)."""
    group = rng.choice(("string", "string", "integer", "integer", "float", "nesting", "other"))
    if group == "string":
        return rng.choice(EDGE_STRINGS)
    if group == "integer":
        return rng.choice(EDGE_INTEGERS)
    if group == "float":
        return rng.choice(EDGE_FLOATS)
    if group == "nesting":
        return _deep(rng.choice(EDGE_NESTING))
    return _fresh(rng.choice(EDGE_OTHER))


# ------------------------------------------------------------------ schemas to strategies


def strategy(schema: Mapping[str, Any], defs: Mapping[str, Any] | None = None) -> Any:
    """A Hypothesis strategy for documents ``schema`` calls valid (the keywords inorder uses)."""
    defs = defs if defs is not None else schema.get("$defs", {})
    if "$ref" in schema:
        return strategy(defs[schema["$ref"].removeprefix("#/$defs/")], defs)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of(*(strategy({**schema, "type": k}, defs) for k in kind))
    builders: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], Any]] = {
        "string": _string,
        # Unbounded in the schema, 64-bit here: the edges go further on purpose.
        "integer": lambda s, _: st.integers(
            s.get("minimum", -(2**63)), s.get("maximum", 2**63 - 1)
        ),
        "boolean": lambda _s, _d: st.booleans(),
        "null": lambda _s, _d: st.none(),
        "array": _array,
        "object": _object,
    }
    return builders[kind](schema, defs) if kind in builders else _any_json()


def _string(schema: Mapping[str, Any], _defs: Mapping[str, Any]) -> Any:
    low, high = schema.get("minLength", 0), schema.get("maxLength", 40)
    if "pattern" in schema:
        pattern = ecma_pattern(schema["pattern"])
        return st.from_regex(pattern, fullmatch=True).filter(lambda s: low <= len(s) <= high)
    return st.text(STORABLE, min_size=low, max_size=min(high, max(low, 40)))


def _array(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Any:
    items = strategy(schema.get("items", {}), defs)
    return st.lists(items, max_size=min(schema.get("maxItems", 5), 5))


def _object(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Any:
    properties = schema.get("properties")
    if not properties:
        return st.dictionaries(st.text(STORABLE, max_size=8), _any_json(), max_size=4)
    required = set(schema.get("required", ()))
    return st.fixed_dictionaries(
        {k: strategy(v, defs) for k, v in properties.items() if k in required},
        optional={k: strategy(v, defs) for k, v in properties.items() if k not in required},
    )


def _any_json() -> Any:
    leaves = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(STORABLE)
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(STORABLE), inner),
        max_leaves=6,
    )


P = ParamSpec("P")
R = TypeVar("R")
ROOT = Path(__file__).resolve().parents[2]
_FRESH = "INORDER_FUZZ_DRAWING"  # set inside the interpreter that draws
_DRAW = (
    "import pickle, sys\n"
    "from tests.faults import boundary_inputs\n"
    "name, args, kwargs = pickle.load(sys.stdin.buffer)\n"
    "made = getattr(boundary_inputs, name).__wrapped__(*args, **kwargs)\n"
    "sys.stdout.buffer.write(pickle.dumps(made))\n"
)


def fresh(function: Callable[P, R]) -> Callable[P, R]:
    """Run ``function`` in an interpreter that has loaded only this module (see above)."""

    @functools.wraps(function)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> R:
        if os.environ.get(_FRESH):
            return function(*args, **kwargs)
        done = subprocess.run(
            [sys.executable, "-c", _DRAW],
            input=pickle.dumps((function.__name__, args, kwargs)),
            capture_output=True,
            check=True,
            cwd=ROOT,
            env={**os.environ, _FRESH: "1", "PYTHONPATH": str(ROOT)},
        )
        made: R = pickle.loads(done.stdout)  # noqa: S301 - written by the line above
        return made

    return drawn


def draw(source: Any, count: int) -> list[Any]:
    """``count`` examples of ``source``, drawn by Hypothesis's own engine."""
    found: list[Any] = []

    @settings(
        max_examples=count,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @seed(count)  # the same inputs every run (in a fresh interpreter: see ``fresh``)
    @given(source)
    def collect(value: Any) -> None:
        found.append(value)

    collect()
    while len(found) < count:  # Hypothesis stops early on small spaces: repeat what it made
        found.extend(found[: count - len(found)])
    return found[:count]


# ------------------------------------------------------------------ mutations and rendering


def _paths(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:20]):
            out += _paths(value, (*path, i))
    return out


def mutate(doc: Any, rng: random.Random) -> tuple[Any, str]:
    """``doc`` changed in one place (or not at all), and a name for what was done."""
    choice = rng.random()
    if choice < 0.25:
        return doc, "valid"
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return edge_value(rng), "replaced whole"
    path = rng.choice(paths)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if choice < 0.32 and isinstance(parent, dict):
        del parent[path[-1]]
        return doc, f"dropped {path[-1]}"
    if choice < 0.38 and isinstance(parent, dict):
        parent[rng.choice(EDGE_STRINGS[:5])] = edge_value(rng)
        return doc, "edge key added"
    value = edge_value(rng)
    parent[path[-1]] = value
    return doc, f"{'/'.join(map(str, path))[:30]} = {_describe(value)}"


def _describe(value: Any) -> str:
    if isinstance(value, str) and value.startswith(_MARK):
        return value.strip(_MARK)[:12]
    text = repr(value)
    return text if len(text) <= 20 else f"{type(value).__name__}[{len(text)}]"


def render(doc: Any) -> bytes:
    """JSON text of ``doc`` with every marker spliced in as raw JSON."""
    text = orjson.dumps(doc)
    while _MARK.encode() in text:
        start = text.index(_MARK.encode())
        end = text.index(_MARK.encode(), start + 1)
        body = text[start + 3 : end].decode()
        # The marker sits inside a JSON string: replace the quotes around it too when it
        # stands for a value, keep them when it stands for characters of a string.
        quoted = text[start - 1 : start] == b'"' and text[end + 3 : end + 4] == b'"'
        if body[0] == "L":
            text = text[:start] + b"\\" + body[1:].encode() + text[end + 3 :]
            continue
        raw = (
            b'{"d":' * int(body[1:]) + b"0" + b"}" * int(body[1:])
            if body[0] == "D"
            else body[1:].encode()
        )
        if quoted:
            text = text[: start - 1] + raw + text[end + 4 :]
        else:  # a marker inside a longer string (a key): keep it as text
            text = text[:start] + body.encode() + text[end + 3 :]
    return text


# ------------------------------------------------------------------ the boundaries' documents


def envelopes(count: int, streams: Mapping[str, str], seed: int) -> list[tuple[str, bytes]]:
    """``count`` envelopes: each stream's event types with payloads from their schemas."""
    return [(what, render(doc)) for what, doc in _envelope_docs(count, streams, seed)]


@fresh
def _envelope_docs(count: int, streams: Mapping[str, str], seed: int) -> list[tuple[str, Any]]:
    rng = random.Random(seed)
    payloads = payload_schemas()
    types = [(stream, t) for t in payloads for stream in streams if t.startswith(f"{stream}.")]
    base = draw(strategy(json_schema("envelope")), max(1, count // 4))
    bodies = {t: draw(strategy(payloads[t]), max(1, count // len(types) // 2)) for _, t in types}
    out = []
    for i in range(count):
        stream, event_type = rng.choice(types)
        doc = _fresh(rng.choice(base))
        doc.update(
            entity_type=stream,
            event_type=event_type,
            entity_id=f"fz{seed}-{i}",
            event_id=f"fz{seed}-{i}",
            generation=1,
            seq=1,
            payload=_fresh(rng.choice(bodies[event_type])),
        )
        doc, what = mutate(doc, rng)
        out.append((f"{event_type}: {what}", doc))
    return out


@fresh
def protocol(name: str, count: int, entities: list[str], seed: int) -> list[tuple[str, bytes]]:
    """``count`` republish requests or results (``name``) about ``entities``, pushed to edges."""
    rng = random.Random(seed)
    base = draw(strategy(json_schema(name)), max(1, count // 4))
    out = []
    for i in range(count):
        doc = _fresh(rng.choice(base))
        doc.update(
            request_id=f"fz{seed}-{i}", entity_type="seat_ledger", entity_id=rng.choice(entities)
        )
        for field in ("from_seq", "to_seq", "generation"):
            doc[field] = min(doc[field], 50)
        doc["to_seq"] = max(doc["to_seq"], doc["from_seq"])
        doc, what = mutate(doc, rng)
        out.append((what, render(doc)))
    return out


OUTBOX_COLUMNS = COLUMNS


def outbox_rows(count: int, topic: str, seed: int) -> list[tuple[str, tuple[Any, ...]]]:
    """``count`` rows for a plain SQL INSERT: the envelope's fields, one pushed to an edge.

    Payload and headers are JSON text (cast to jsonb by the statement); every other
    value is bound as it is, so PostgreSQL's own types and CHECKs meet the edge.
    """
    rng = random.Random(seed)
    out = []
    for what, drawn in _envelope_docs(count, {"subscription": "", "seat_ledger": ""}, seed):
        doc = drawn if isinstance(drawn, dict) else {"payload": drawn}
        headers: Any = {"trace": "t"} if rng.random() < 0.2 else {}
        if rng.random() < 0.1:
            headers = {"h": edge_value(rng)}
        row_topic = rng.choice([topic] * 19 + ["no-such", "bad topic", "x" * 250])
        values: list[Any] = [row_topic]
        for column in OUTBOX_COLUMNS[1:7]:
            value = doc.get(column)
            if isinstance(value, str) and value.startswith(_MARK):
                value = render(value).decode()  # as the text a client would send
            values.append(orjson.dumps(value).decode() if isinstance(value, dict | list) else value)
        values += [render(doc.get("payload")).decode(), render(headers).decode()]
        out.append((what, tuple(values)))
    return out


ROUTE_TEMPLATES = [
    '[[route]]\nstream = {stream}\nkind = "projection"\ntable = {table}\nkey = {key}\n'
    "[route.columns]\nplan = {column}\n",
    '[[route]]\nstream = {stream}\nkind = "step"\nmax_parked = {number}\n[route.handlers]\n'
    '{event_type} = "tests.faults.effects:add_seats"\n',
    '[[route]]\nstream = {stream}\nkind = "batch"\noutput_topic = {table}\nwork_topic = {key}\n'
    "max_retries = {number}\n",
]


def routes_files(count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` routes files, each one route with one value pushed to an edge."""
    rng = random.Random(seed)
    valid = {
        "stream": '"subscription"',
        "table": '"billing_view"',
        "key": '"subscription_id"',
        "column": '"plan"',
        "event_type": '"seat_ledger.seats_added"',
        "number": "100",
    }
    out = []
    for _ in range(count):
        template = rng.choice(ROUTE_TEMPLATES)
        values = dict(valid)
        field = rng.choice(sorted(values))
        edge = edge_value(rng)
        if isinstance(edge, str) and not edge.startswith(_MARK):
            values[field] = orjson.dumps(edge).decode()
        elif isinstance(edge, int) and not isinstance(edge, bool):
            values[field] = str(edge)
        else:
            values[field] = rng.choice(['""', "[]", "{}", "true", "= ="])
        out.append((f"{field} = {values[field][:20]}", template.format(**values)))
    return out
