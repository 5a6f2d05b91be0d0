"""The envelope codec: round trips, and a specific reason for every kind of bad input."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import schemas
from schemas import codec

VALID: dict[str, Any] = {
    "event_id": "subscription:s1:1:7",
    "event_type": "subscription.plan_changed",
    "entity_type": "subscription",
    "entity_id": "s1",
    "generation": 1,
    "seq": 7,
    "occurred_at": "2026-11-30T10:00:00.123456Z",
    "published_at": "2026-11-30T10:00:01+00:00",
    "payload": {"plan": "pro", "price_cents": 2900, "status": "active"},
}


def _with(**changes: Any) -> bytes:
    doc = {**VALID, **changes}
    return orjson.dumps({k: v for k, v in doc.items() if v is not _DROP})


_DROP = object()


def test_valid_envelope_decodes_to_event() -> None:
    """A valid envelope decodes to an Event with every field, keyed entity_type:entity_id."""
    event = schemas.decode(orjson.dumps(VALID))
    assert event == schemas.Event(**VALID)
    assert event.version == (1, 7)
    assert event.key == b"subscription:s1"


@pytest.mark.parametrize(
    ("raw", "reason", "field"),
    [
        (None, codec.EMPTY, None),
        (b"", codec.EMPTY, None),
        (b"x" * (codec.MAX_MESSAGE_BYTES + 1), codec.TOO_LARGE, None),
        (b'{"event_id": "\xff\xfe"}', codec.INVALID_UTF8, None),
        (b"[" * 2000 + b"]" * 2000, codec.TOO_DEEP, None),
        (b"{not json", codec.NOT_JSON, None),
        (b'{"seq": NaN}', codec.NOT_JSON, None),
        (b"[1, 2]", codec.NOT_OBJECT, None),
        (b'"a string"', codec.NOT_OBJECT, None),
        (b"null", codec.NOT_OBJECT, None),
        (_with(seq=_DROP), codec.MISSING_FIELD, "seq"),
        (_with(payload=_DROP), codec.MISSING_FIELD, "payload"),
        (_with(entity_id=_DROP), codec.MISSING_FIELD, "entity_id"),
        (_with(seq="7"), codec.WRONG_TYPE, "seq"),
        (_with(seq=True), codec.WRONG_TYPE, "seq"),
        (_with(seq=7.5), codec.WRONG_TYPE, "seq"),
        (_with(generation=None), codec.WRONG_TYPE, "generation"),
        (_with(entity_id=42), codec.WRONG_TYPE, "entity_id"),
        (_with(payload=[1, 2]), codec.WRONG_TYPE, "payload"),
        (_with(payload="{}"), codec.WRONG_TYPE, "payload"),
        (_with(seq=0), codec.OUT_OF_RANGE, "seq"),
        (_with(seq=-3), codec.OUT_OF_RANGE, "seq"),
        (_with(seq=2**63), codec.OUT_OF_RANGE, "seq"),
        (orjson.dumps(VALID).replace(b'"seq":7', b'"seq":1e30'), codec.OUT_OF_RANGE, "seq"),
        (
            orjson.dumps(VALID).replace(b'"seq":7', b'"seq":99999999999999999999999'),
            codec.OUT_OF_RANGE,
            "seq",
        ),
        (_with(generation=0), codec.OUT_OF_RANGE, "generation"),
        (_with(entity_id=""), codec.BAD_LENGTH, "entity_id"),
        (_with(entity_id="x" * 257), codec.BAD_LENGTH, "entity_id"),
        (_with(event_id=""), codec.BAD_LENGTH, "event_id"),
        (_with(entity_type="sub:scription"), codec.BAD_FORMAT, "entity_type"),
        (_with(entity_type="Subscription"), codec.BAD_FORMAT, "entity_type"),
        (_with(event_type="Plan Changed"), codec.BAD_FORMAT, "event_type"),
        (_with(occurred_at="yesterday"), codec.BAD_FORMAT, "occurred_at"),
        (_with(published_at="2026-11-30T10:00:00Z\n"), codec.BAD_FORMAT, "published_at"),
    ],
)
def test_bad_input_is_rejected_with_its_reason(
    raw: bytes | None, reason: str, field: str | None
) -> None:
    """Each kind of bad input raises DecodeError with its own reason, field and raw bytes."""
    with pytest.raises(schemas.DecodeError) as caught:
        schemas.decode(raw)
    assert caught.value.reason == reason
    assert caught.value.field == field
    assert caught.value.raw == raw
    if field is not None:
        assert field in caught.value.detail


def test_size_cap_is_configurable() -> None:
    """A caller may lower the size cap; a message over it is too_large before parsing."""
    raw = orjson.dumps(VALID)
    with pytest.raises(schemas.DecodeError) as caught:
        schemas.decode(raw, max_bytes=len(raw) - 1)
    assert caught.value.reason == codec.TOO_LARGE


def test_integral_float_is_an_integer() -> None:
    """JSON has one number type, so 7.0 is seq 7."""
    assert schemas.decode(_with(seq=7.0)).seq == 7


def test_unknown_top_level_fields_are_ignored() -> None:
    """Producers may add envelope fields; readers ignore what they do not know."""
    assert schemas.decode(_with(trace_id="abc")) == schemas.Event(**VALID)


# Any text a store can hold: everything but NUL and lone surrogates.
chars = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
storable = st.text(alphabet=chars)
ids = st.text(alphabet=chars, min_size=1, max_size=256)
names = st.from_regex(r"\A[a-z][a-z0-9_]{0,20}\Z")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | storable,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(storable, inner, max_size=3),
    max_leaves=10,
)


# Any valid value of each envelope field but the two timestamps.
EVENT_FIELDS = {
    "entity_id": ids,
    "event_id": ids,
    "entity_type": names,
    "event_type": names.map(lambda n: f"x.{n}"),
    "generation": st.integers(1, 2**63 - 1),
    "seq": st.integers(1, 2**63 - 1),
    "payload": st.dictionaries(storable, json_values, max_size=5),
}


@given(**EVENT_FIELDS)
def test_encode_then_decode_is_identity(**fields: Any) -> None:
    """Any valid event survives encode then decode unchanged."""
    event = schemas.Event(
        occurred_at="2026-01-02T03:04:05Z", published_at="2026-01-02T03:04:06.5-01:00", **fields
    )
    assert schemas.decode(schemas.encode(event)) == event


@given(**EVENT_FIELDS)
def test_rendered_parts_make_the_same_envelope_as_encode(**fields: Any) -> None:
    """Timestamps and payload spliced in as JSON text give the document encode gives."""
    event = schemas.Event(
        occurred_at="2026-01-02T03:04:05Z", published_at="2026-01-02T03:04:06.5-01:00", **fields
    )
    rendered = schemas.encode_rendered(
        event.event_id,
        schemas.rendered_types(event.event_type, event.entity_type),
        (event.entity_id, event.generation, event.seq),
        orjson.dumps(event.occurred_at).decode(),
        orjson.dumps(event.published_at).decode(),
        orjson.dumps(event.payload, option=orjson.OPT_INDENT_2).decode(),
    )
    assert orjson.loads(rendered) == schemas.to_document(event)
    assert list(orjson.loads(rendered)) == list(schemas.to_document(event))
    assert schemas.decode(rendered) == event


@given(st.text())
def test_rendered_strings_are_escaped_as_orjson_escapes_them(text: str) -> None:
    """Any string the envelope splices in is the JSON text orjson writes for it, byte for byte."""
    types = schemas.rendered_types("a.b", "a")
    rendered = schemas.encode_rendered(text, types, (text, 1, 1), '""', '""', "{}")
    assert rendered.startswith(b'{"event_id":' + orjson.dumps(text) + b',"event_type":"a.b",')
    assert orjson.loads(rendered)["entity_id"] == text


def test_remembered_valid_types_do_not_let_invalid_ones_through() -> None:
    """After many valid event types are remembered, a near miss is still bad_format."""
    for i in range(codec.MEMO_SIZE + 10):
        assert schemas.decode(_with(event_type=f"subscription.t{i}")).event_type.endswith(str(i))
    for bad in ("Subscription.t1", "subscription.t1.", "subscription..t1", "subscription.t1\n"):
        with pytest.raises(schemas.DecodeError) as caught:
            schemas.decode(_with(event_type=bad))
        assert caught.value.reason == codec.BAD_FORMAT, bad


def test_fast_path_event_equals_a_constructed_one() -> None:
    """The event the fast path builds is equal, hashes the same and stays frozen."""
    event = schemas.decode(orjson.dumps(VALID))
    built = schemas.Event(**VALID)
    assert event == built
    assert hash(event.version) == hash(built.version)
    with pytest.raises(AttributeError):
        event.seq = 8  # type: ignore[misc]
