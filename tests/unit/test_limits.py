"""What no store or serializer on the path can take is found at the door, and nothing else is."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import DecodeError, codec, decode, encode
from schemas.limits import (
    LONE_SURROGATE,
    MAX_DEPTH,
    NUL_IN_TEXT,
    TOO_DEEP,
    safe_text,
    suspect,
    text_problem,
    value_problem,
)
from tests.faults.mutations import valid_event


def nested(levels: int) -> Any:
    """``levels`` levels of arrays and objects, alternating."""
    value: Any = 0
    for i in range(levels):
        value = [value] if i % 2 else {"d": value}
    return value


def raw_nested(levels: int) -> bytes:
    """The same as JSON text, made without a serializer (which stops at 254 levels)."""
    return b'{"d":' * levels + b"0" + b"}" * levels


@pytest.mark.parametrize("levels", [1, 2, MAX_DEPTH - 1, MAX_DEPTH])
def test_nesting_up_to_the_limit_passes(levels: int) -> None:
    """A document nesting exactly to the limit passes, parsed or as text."""
    assert value_problem(nested(levels)) is None
    assert text_problem(raw_nested(levels)) is None
    assert orjson.loads(orjson.dumps(nested(levels))) == nested(levels)  # and can be written


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 200, 253, 254, 1023, 1024, 1025, 5000])
def test_nesting_past_the_limit_is_too_deep(levels: int) -> None:
    """One level past the limit, orjson's own limits, and far past them: too deep."""
    problem = text_problem(raw_nested(levels))
    assert problem is not None
    assert problem[0] == TOO_DEEP
    if levels < 1024:
        assert value_problem(orjson.loads(raw_nested(levels)))[0] == TOO_DEEP  # type: ignore[index]


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    """Many brackets in a string: looked at closely, and passed."""
    text = orjson.dumps({"s": "[{" * 1000})
    assert suspect(text)
    assert text_problem(text) is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("a\x00b", NUL_IN_TEXT),
        ({"k\x00": 1}, NUL_IN_TEXT),
        ({"a": [1, {"b": "\x00"}]}, NUL_IN_TEXT),
        ("\ud800", LONE_SURROGATE),
        ("x\udfff", LONE_SURROGATE),
        ({"\udc00": 1}, LONE_SURROGATE),
    ],
)
def test_text_no_store_holds_is_named(value: Any, reason: str) -> None:
    """NUL and lone surrogates, in values or keys, at any depth, each with its reason."""
    problem = value_problem(value)
    assert problem is not None
    assert problem[0] == reason


def test_an_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    """``\\\\u0000`` in JSON is a backslash followed by text, not a NUL."""
    text = b'{"a": "\\\\u0000"}'
    assert orjson.loads(text) == {"a": "\\u0000"}
    assert text_problem(text) is None


@given(st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00")))
def test_any_other_text_passes(text: str) -> None:
    """Every character a store holds, control characters and astral planes included, passes."""
    assert value_problem({"k": text, text: [text]}) is None
    assert text_problem(orjson.dumps({"k": text})) is None


@given(st.text())
def test_safe_text_is_always_storable(text: str) -> None:
    """Whatever a detail holds, its safe form has no NUL and encodes as UTF-8."""
    safe = safe_text(text + "\x00\ud800")
    assert "\x00" not in safe
    safe.encode("utf-8")


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("entity_id", "a\x00", NUL_IN_TEXT),
        ("event_id", "\x00", NUL_IN_TEXT),
        ("payload", {"plan": "\x00"}, NUL_IN_TEXT),
        ("payload", {"k\x00": 1}, NUL_IN_TEXT),
        ("payload", {"deep": nested(MAX_DEPTH)}, TOO_DEEP),
        ("seq", 2**63, codec.OUT_OF_RANGE),
        ("generation", 2**63, codec.OUT_OF_RANGE),
        ("seq", 2**64, codec.OUT_OF_RANGE),
        ("seq", -(2**63) - 1, codec.OUT_OF_RANGE),
        ("seq", 2**31 + 0.5, codec.WRONG_TYPE),
        ("entity_id", "x" * 257, codec.BAD_LENGTH),
    ],
)
def test_the_codec_refuses_each_class_with_its_reason(field: str, value: Any, reason: str) -> None:
    """An envelope carrying a value past a limit is refused, naming the limit."""
    doc = codec.to_document(valid_event(1))
    if isinstance(value, int) and not -(2**63) <= value < 2**64:  # past what orjson writes
        raw = orjson.dumps({**doc, field: 0}).replace(b'"seq":0', f'"seq":{value}'.encode())
    else:
        raw = orjson.dumps({**doc, field: value})
    with pytest.raises(DecodeError) as refused:
        decode(raw)
    assert refused.value.reason == reason


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udbff", b"\\udc00", b"\\udfff"])
def test_the_codec_refuses_escaped_lone_surrogates(escape: bytes) -> None:
    """A lone surrogate written as an escape is not Unicode text: refused with its own reason."""
    raw = encode(valid_event(1)).replace(b'"entity_id":"', b'"entity_id":"' + escape, 1)
    with pytest.raises(DecodeError) as refused:
        decode(raw)
    assert refused.value.reason == LONE_SURROGATE


def test_the_codec_takes_the_edges_that_are_valid() -> None:
    """The longest ids, the largest versions, control characters, nesting at the limit."""
    doc = codec.to_document(valid_event(1))
    doc.update(
        entity_id="x" * 256,
        event_id="\x01\x1f\x7f" * 10,
        seq=2**63 - 1,
        generation=2**63 - 1,
        payload={"deep": nested(MAX_DEPTH - 2), "big": 2**64 - 1, "small": -(2**63)},
    )
    event = decode(orjson.dumps(doc))
    assert (event.entity_id, event.seq, event.payload["big"]) == ("x" * 256, 2**63 - 1, 2**64 - 1)


def test_the_shortest_text_past_the_limit_is_caught() -> None:
    """Bare brackets, two bytes a level: 128 levels pass, 129 (258 bytes) are too deep."""
    assert text_problem(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is None
    deepest = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    problem = text_problem(deepest)
    assert problem is not None
    assert problem[0] == TOO_DEEP


def test_no_valid_envelope_short_enough_to_skip_the_count_can_nest_past_the_limit() -> None:
    """The codec counts brackets only past a length no deep valid envelope can be under."""
    doc = codec.to_document(valid_event(1))
    doc.update(
        event_id="x",
        event_type="a",
        entity_type="a",
        entity_id="x",
        occurred_at="0000-00-00T00:00:00Z",
        published_at="0000-00-00T00:00:00Z",
        payload=nested(MAX_DEPTH - 1),
    )
    deepest_allowed = orjson.dumps(doc)
    assert decode(deepest_allowed).entity_id == "x"
    doc["payload"] = {"d": nested(MAX_DEPTH - 1)}
    one_more = orjson.dumps(doc)
    assert len(one_more) > codec._DEEP_BYTES
    with pytest.raises(DecodeError) as refused:
        decode(one_more)
    assert refused.value.reason == TOO_DEEP


@pytest.mark.parametrize("number", [str(2**64), str(-(2**63) - 1), "150000000000000000000"])
def test_a_payload_integer_past_64_bits_is_read_as_the_nearest_double(number: str) -> None:
    """jsonb prints the float 1.5e20 as 150000000000000000000: text past 64 bits is a double."""
    doc = codec.to_document(valid_event(1))
    raw = orjson.dumps({**doc, "payload": {"n": 0}}).replace(b'"n":0', f'"n":{number}'.encode())
    assert decode(raw).payload["n"] == float(number)


@pytest.mark.parametrize("number", [2**64, -(2**63) - 1, 10**30])
def test_a_python_integer_past_64_bits_is_refused_where_it_enters(number: int) -> None:
    """emit's check names an int no writer takes (orjson would raise TypeError later)."""
    problem = value_problem({"a": [number]}, where="payload")
    assert problem is not None
    assert problem[0] == "out_of_range"
    assert "payload/a/0" in problem[1]
