"""Messages as Debezium's outbox event router writes them: read into inorder's events, or refused
with a reason; and the message the republish-only relay writes reads back as the same event."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import DecodeError, decode
from schemas.debezium import Fields, Shape, envelope, message, placements

SHAPE = Shape(placement="type:header:eventType,seq:header:seq,generation:header:gen")
SHAPE_GEN = Shape(
    placement="type:header:eventType,seq:header:seq,generation:header:gen",
    generation_field="generation",
)
TOPIC = "outbox.event.ledger"
AT_MS = 1_796_477_841_369  # 2026-12-05T13:37:21.369Z
HEADERS = [
    ("id", b"2360beb4-16a9-46bd-8277-6b782c16780b"),
    ("eventType", b"ledger.added"),
    ("seq", b"3"),
]


def _read(
    value: bytes | None = b'{"amount": 5}',
    headers: list[tuple[str, bytes | None]] | None = None,
    key: bytes | None = b"a1",
    topic: str = TOPIC,
    shape: Shape = SHAPE,
    at: int | None = AT_MS,
):
    return decode(envelope(shape, topic, key, HEADERS if headers is None else headers, value, at))


def _refused(**kwargs) -> DecodeError:
    with pytest.raises(DecodeError) as refused:
        _read(**kwargs)
    return refused.value


def test_a_router_message_is_the_event_its_row_holds() -> None:
    """Key, id header, type and seq headers, topic, timestamp and value make the event."""
    event = _read()
    assert (event.entity_type, event.entity_id, event.event_type) == (
        "ledger",
        "a1",
        "ledger.added",
    )
    assert (event.event_id, event.generation, event.seq) == (HEADERS[0][1].decode(), 1, 3)
    assert event.occurred_at == event.published_at == "2026-12-05T13:37:21.369Z"
    assert event.payload == {"amount": 5}


def test_the_json_converter_s_string_payload_and_quoted_key_are_read() -> None:
    """A jsonb payload through the JSON converter is a JSON string, the key a quoted string."""
    event = _read(value=orjson.dumps('{"amount": 5}'), key=b'"a1"')
    assert (event.entity_id, event.payload) == ("a1", {"amount": 5})


def test_the_generation_header_is_read_when_the_table_has_one() -> None:
    """With a generation field the version is (its header, seq); without it, generation 1."""
    headers = [*HEADERS, ("gen", b"4")]
    assert _read(headers=headers, shape=SHAPE_GEN).version == (4, 3)
    assert _read(headers=headers).version == (1, 3)


def test_the_stream_comes_from_a_header_when_the_route_by_field_is_placed() -> None:
    """`aggregatetype:header:stream` names the stream; the topic may then be any."""
    shape = Shape(placement="type:header:eventType,seq:header:seq,aggregatetype:header:stream")
    event = _read(headers=[*HEADERS, ("stream", b"seat_ledger")], topic="all.events", shape=shape)
    assert event.entity_type == "seat_ledger"


@pytest.mark.parametrize(
    ("kwargs", "reason", "says"),
    [
        ({"headers": HEADERS[1:]}, "missing_field", "no header id"),
        ({"headers": [HEADERS[0], HEADERS[2]]}, "missing_field", "no header eventType"),
        ({"headers": HEADERS[:2]}, "missing_field", "no header seq"),
        ({"headers": [*HEADERS[:2], ("seq", b"x1")]}, "wrong_type", "seq must be a whole number"),
        ({"headers": [*HEADERS[:2], ("seq", b"99999999999999999999")]}, "out_of_range", "past"),
        ({"headers": [*HEADERS, ("seq", b"4")]}, "ambiguous", "comes twice"),
        ({"headers": [*HEADERS[:2], ("seq", b"\xff")]}, "invalid_utf8", "not UTF-8"),
        ({"key": None}, "missing_field", "no key"),
        ({"key": b"\xff\xfe"}, "invalid_utf8", "the key"),
        ({"value": None}, "missing_field", "no value"),
        ({"value": b"{"}, "not_json", "not JSON"),
        ({"value": b"[1]"}, "wrong_type", "payload"),
        ({"value": b'{"schema": {"type": "string"}, "payload": "{}"}'}, "bad_format", "envelope"),
        ({"value": b"[" * 300 + b"]" * 300}, "too_deep", "deeper"),
        ({"topic": "outbox.event."}, "bad_format", "no stream"),
        ({"topic": "other.ledger"}, "bad_format", "no stream"),
        ({"at": None}, "missing_field", "timestamp"),
        ({"at": 10**18}, "bad_format", "cannot be read"),
        ({"headers": [*HEADERS[:2], ("seq", b"0")]}, "out_of_range", ""),
    ],
)
def test_each_missing_or_bad_part_is_refused_with_its_reason(
    kwargs: dict, reason: str, says: str
) -> None:
    """A message that cannot be an event is refused with a reason, never anything else."""
    refused = _refused(**kwargs)
    assert refused.reason == reason
    assert says in refused.detail


_EDGE_TEXT = st.one_of(
    st.none(),
    st.binary(max_size=30),
    st.from_regex(r"-?\d{1,22}", fullmatch=True).map(str.encode),
    st.sampled_from([b"", b"0", b"-1", b"9223372036854775807", b"9223372036854775808", b"\xff"]),
)
_JSON = st.recursive(
    st.none() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=5),
    lambda c: st.lists(c) | st.dictionaries(st.text(max_size=3), c),
    max_leaves=8,
).map(orjson.dumps)
_PARTS = {
    "id": _EDGE_TEXT,
    "eventType": _EDGE_TEXT,
    "seq": _EDGE_TEXT,
    "gen": _EDGE_TEXT,
    "twice": st.sampled_from(["id", "eventType", "seq", "gen"]),
    "value": st.one_of(
        st.none(),
        st.binary(max_size=60),
        _JSON,
        _JSON.map(lambda j: orjson.dumps(j.decode())),
        st.integers(1, 1100).map(lambda n: b"[" * n + b"]" * n),
    ),
    "key": st.one_of(st.none(), st.binary(max_size=12), st.just(b'"q"'), st.just(b'"')),
    "topic": st.sampled_from(["outbox.event.", "x", "outbox.event.Ledger", "outbox.event.a b"]),
    "at": st.one_of(
        st.none(),
        st.integers(-(2**63), 2**63 - 1),
        # the last millisecond of year 9999, and past it
        st.integers(253_402_300_799_000, 253_402_300_800_999),
        st.sampled_from([-1, 0, 2**63 - 1, 10**15]),
    ),
}


@settings(max_examples=400)
@given(data=st.data(), changed=st.sets(st.sampled_from(sorted(_PARTS)), min_size=1, max_size=3))
def test_whatever_a_message_holds_it_is_read_or_refused_with_a_reason(
    data: st.DataObject, changed: set[str]
) -> None:
    """A valid message with up to three of its parts pushed to an edge (a header's text, one
    said twice, the value, key, topic or timestamp): an event or a DecodeError, nothing else."""
    headers: dict[str, bytes | None] = {"id": b"e-1", "eventType": b"ledger.added", "seq": b"3"}
    headers["gen"] = b"2"
    message: dict[str, Any] = {"value": b'{"amount": 5}', "key": b"a1", "topic": TOPIC, "at": AT_MS}
    pairs: list[tuple[str, bytes | None]] = []
    for part in sorted(changed):
        drawn = data.draw(_PARTS[part], label=part)
        if part in headers:
            headers[part] = drawn
        elif part == "twice":
            pairs.append((drawn, b"other"))
        else:
            message[part] = drawn
    pairs = [*headers.items(), *pairs]
    reason = "read"
    try:
        _read(headers=pairs, shape=SHAPE_GEN, **message)
    except DecodeError as exc:
        reason = exc.reason
    assert reason


_IDENT = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)


@given(
    stream=_IDENT,
    entity=st.text(min_size=1, max_size=20).filter(lambda s: s.strip() == s and "\x00" not in s),
    seq=st.integers(1, 2**63 - 1),
    generation=st.integers(1, 2**63 - 1),
    amount=st.integers(-(2**53), 2**53),
    as_text=st.booleans(),
)
def test_a_re_sent_row_reads_back_as_the_event_debezium_sent(
    stream: str, entity: str, seq: int, generation: int, amount: int, as_text: bool
) -> None:
    """The republish-only relay's message for a row is read as the event of that row."""
    row = {
        "id": "9f1c0d2e-0000-4000-8000-000000000001",
        "aggregatetype": stream,
        "aggregateid": entity,
        "type": f"{stream}.changed",
        "seq": seq,
        "generation": generation,
        "payload": orjson.dumps({"amount": amount}).decode() if as_text else {"amount": amount},
    }
    sent = message(SHAPE_GEN, Fields(), row)
    assert sent.topic == f"outbox.event.{stream}"
    try:
        event = decode(envelope(SHAPE_GEN, sent.topic, sent.key, sent.headers, sent.value, AT_MS))
    except DecodeError as exc:  # the codec's own limits on an entity id still hold
        refused = exc.field
    else:
        refused = None
    if refused is not None:
        assert refused == "entity_id"
        return
    assert (event.entity_type, event.entity_id, event.event_type) == (stream, entity, row["type"])
    assert (event.generation, event.seq, event.payload) == (generation, seq, {"amount": amount})
    assert event.event_id == row["id"]


def test_placements_are_read_as_debezium_reads_them() -> None:
    """`field:header[:name]` and `field:envelope[:name]`; a name defaults to the field's."""
    assert placements("type:header:eventType, seq:header,x:envelope:y") == {
        "type": ("header", "eventType"),
        "seq": ("header", "seq"),
        "x": ("envelope", "y"),
    }
    with pytest.raises(ValueError, match="not field:header"):
        placements("type:headers:eventType")


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        (Shape(placement="type:header:eventType"), "field 'seq' is not placed in a header"),
        (Shape(placement="seq:header"), "field 'type' is not placed in a header"),
        (
            Shape(placement="type:header:t,seq:header:s", generation_field="gen"),
            "field 'gen' is not placed in a header",
        ),
        (Shape(placement="type:header:t,seq:header:s,x:envelope"), "placed in the envelope"),
        (
            Shape(placement="type:header:t,seq:header:s", topic_replacement="all"),
            "the stream is in",
        ),
        (Shape(placement="type:header,seq:header:s,bad"), "not field:header"),
    ],
)
def test_a_configuration_that_cannot_name_every_field_says_what_to_fix(
    shape: Shape, says: str
) -> None:
    """Each field inorder needs must be in a header; the stream in a header or the topic."""
    assert any(says in p for p in shape.problems())


def test_the_default_configuration_names_every_field() -> None:
    """Debezium's defaults plus `type` and `seq` in headers need nothing more."""
    assert Shape(placement="type:header:eventType,seq:header:seq").problems() == []
