"""What every store and serializer on an event's path can take, checked at the door.

One JSON document travels through orjson (which refuses to write past 254 levels of
nesting and to read past 1,024), PostgreSQL (``text`` and ``jsonb`` hold no NUL, and
``jsonb`` no lone surrogate), the standard ``json`` module (Python's recursion limit)
and typed columns (``bigint``, ``integer``). A value any of them would refuse is
refused where it enters, with its own reason, instead of failing a write later for
every input of the batch it came with.

``text_problem`` looks at JSON text without parsing it when it cannot hold a problem
(no ``\\u0000`` escape, too short or too few brackets to nest past the limit): the usual
case costs one byte search, two more for long text. ``value_problem`` walks a parsed
value, without recursion.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final

import orjson

# Levels of objects and arrays in one JSON document, the envelope's own included: far
# below orjson's 254 when writing, so anything read can be written again.
MAX_DEPTH: Final = 128
# A payload sits one level inside its envelope.
MAX_PAYLOAD_DEPTH: Final = MAX_DEPTH - 1

# Reason codes (dead-letter headers, failed rows, metric labels).
NUL_IN_TEXT: Final = "nul_in_text"
LONE_SURROGATE: Final = "lone_surrogate"
TOO_DEEP: Final = "too_deep"
OUT_OF_RANGE: Final = "out_of_range"
NOT_JSON: Final = "not_json"

# What a 64-bit JSON writer (orjson) can write of a Python int, signed or unsigned. Read
# from text, a longer integer is the nearest double (jsonb prints the float 1.5e20 as
# 150000000000000000000, so text cannot tell the two apart); held as an int, it is
# refused where it enters (``emit``), before anything tries to write it.
WIDEST_INTEGERS: Final = (-(2**63), 2**64 - 1)

_SURROGATE = re.compile("[\ud800-\udfff]")

Problem = tuple[str, str]


def string_problem(value: str, where: str = "a string") -> Problem | None:
    """Why ``value`` cannot be stored as text: a NUL, or a lone surrogate."""
    if "\x00" in value:
        return NUL_IN_TEXT, f"{where} holds a NUL character, which PostgreSQL text cannot store"
    if _SURROGATE.search(value) is not None:
        return LONE_SURROGATE, f"{where} holds a lone surrogate, which is not Unicode text"
    return None


def safe_text(value: str) -> str:
    """``value`` with NULs and lone surrogates escaped, so any store or log can hold it."""
    if "\x00" not in value and _SURROGATE.search(value) is None:
        return value
    escaped = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return escaped.replace("\x00", "\\x00")


def _short(path: str) -> str:
    return path if len(path) <= 100 else f"{path[:60]}...{path[-30:]}"


# Where a value sits, kept as a link to its parent and built into text only for a
# value that has a problem: walking a payload builds no strings.
_Trail = tuple[Any, ...]  # (parent trail, key or index), or (root name,)


def _path(trail: _Trail) -> str:
    parts: list[str] = []
    while len(trail) == 2:
        trail, step = trail
        parts.append(safe_text(step[:40]) if type(step) is str else str(step))
    parts.append(trail[0])
    return _short("/".join(reversed(parts)))


def _scalar_problem(item: Any, kind: type, trail: _Trail) -> Problem | None:
    if kind is str:
        if "\x00" in item or _SURROGATE.search(item) is not None:
            return string_problem(item, _path(trail))
    elif kind is int and not WIDEST_INTEGERS[0] <= item <= WIDEST_INTEGERS[1]:
        return OUT_OF_RANGE, f"{_path(trail)} is an integer past 64 bits, which no writer takes"
    elif kind is float and not math.isfinite(item):
        # orjson would write null in its place, the json module a token no JSON reader takes
        return NOT_JSON, f"{_path(trail)} is {item}, which JSON cannot hold"
    return None


def value_problem(value: Any, max_depth: int = MAX_DEPTH, where: str = "") -> Problem | None:
    """Why a parsed JSON value cannot pass every store and serializer, or None."""
    stack: list[tuple[Any, int, _Trail]] = [(value, 1, (where or "(document)",))]
    while stack:
        item, depth, trail = stack.pop()
        kind = type(item)
        if kind is dict or kind is list:
            if depth > max_depth:
                return TOO_DEEP, f"{_path(trail)} nests deeper than {max_depth} levels"
            if kind is dict:
                for key, child in item.items():
                    if type(key) is not str:
                        name = type(key).__name__
                        return NOT_JSON, f"a key of {_path(trail)} is not a string: {name}"
                    if "\x00" in key or _SURROGATE.search(key) is not None:
                        return string_problem(key, f"a key of {_path(trail)}")
                    stack.append((child, depth + 1, (trail, key)))
            else:
                stack.extend((child, depth + 1, (trail, i)) for i, child in enumerate(item))
        else:
            problem = _scalar_problem(item, kind, trail)
            if problem is not None:
                return problem
    return None


def suspect(text: bytes | str, max_depth: int = MAX_DEPTH) -> bool:
    """Whether JSON ``text`` may hold an escaped NUL or nest past the limit (cheap)."""
    # Text shorter than two characters a level cannot nest past the limit.
    if isinstance(text, str):
        deep = len(text) > 2 * max_depth and text.count("[") + text.count("{") > max_depth
        return deep or "\\u0000" in text
    deep = len(text) > 2 * max_depth and text.count(b"[") + text.count(b"{") > max_depth
    return deep or b"\\u0000" in text


def text_problem(
    text: bytes | str, what: str = "the document", max_depth: int = MAX_DEPTH
) -> Problem | None:
    """Why JSON ``text`` cannot pass every store and serializer; parsed only when suspect."""
    if not suspect(text, max_depth):
        return None
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "recursion" in str(exc).lower():
            return TOO_DEEP, f"{what} nests deeper than {max_depth} levels"
        raise
    return value_problem(parsed, max_depth, where=what)
