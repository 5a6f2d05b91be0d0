"""CloudEvents on Kafka: the relay's binary mode read by the SDK, and CloudEvents read back."""

from __future__ import annotations

import contextlib
from datetime import datetime
from functools import partial
from typing import Any

import orjson
import pytest
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from hypothesis import given, settings
from hypothesis import strategies as st

import schemas
from outbox_relay.rows import OutboxRow, to_messages
from schemas import DecodeError, cloudevents
from tests.support.outbox_rows import NOW, PAYLOAD, outbox_row

# An event type without a schema, allowed: the rows carry any payload.
_row = partial(
    outbox_row,
    entity_id="s1:eu",
    event_type="subscription.noted",
    event_id="subscription:s1:eu:2:5",
)


def _sent(row: OutboxRow, *, cloud: bool) -> tuple[bytes, bytes, list[tuple[str, Any]]]:
    registry = schemas.PayloadSchemas(allow_unknown=True)
    messages, problems = to_messages(
        [row], NOW, schemas=registry, max_bytes=10_000, cloudevents=cloud
    )
    assert problems == []
    [(_, _, key, value, headers)] = messages
    return key, value, headers


def _as_bytes(headers: list[tuple[str, Any]]) -> dict[str, bytes]:
    return {k: v if isinstance(v, bytes) else v.encode() for k, v in headers}


def test_the_relay_s_cloudevent_is_read_by_the_sdk_as_the_same_event() -> None:
    """Binary mode, read with the CloudEvents SDK's Kafka binding: every attribute, the data."""
    key, value, headers = _sent(_row(), cloud=True)
    event = ce_kafka.from_binary(
        ce_kafka.KafkaMessage(_as_bytes(headers), key, value), JSONFormat()
    )
    attributes = event.get_attributes()
    assert attributes["id"] == "subscription:s1:eu:2:5"
    assert attributes["type"] == "subscription.noted"
    assert attributes["source"] == "/inorder/subscription"
    assert attributes["subject"] == "subscription:s1:eu"
    assert attributes["time"] == datetime.fromisoformat("2026-11-30T11:59:00+00:00")
    assert attributes["sequence"] == "00000000000000000002-00000000000000000005"
    assert (attributes["inordergeneration"], attributes["inorderseq"]) == ("2", "5")
    assert attributes["inorderpublished"] == "2026-11-30T12:00:00+00:00"
    assert event.get_data() == PAYLOAD
    assert _as_bytes(headers)["trace"] == b"t"  # the row's own headers go along


def test_a_cloudevent_reads_back_as_the_event_the_envelope_carries() -> None:
    """The consumer's reading of the relay's CloudEvent equals its reading of the envelope."""
    _, envelope_value, _ = _sent(_row(), cloud=False)
    _, value, headers = _sent(_row(), cloud=True)
    translated = cloudevents.envelope(headers, value)
    assert translated is not None
    assert schemas.decode(translated) == schemas.decode(envelope_value)


def _sdk_event(**attributes: Any) -> CloudEvent:
    base = {
        "id": "e-1",
        "source": "/billing",
        "type": "subscription.noted",
        "specversion": "1.0",
        "subject": "subscription:s9",
        "time": datetime.fromisoformat("2026-12-01T10:00:00+00:00"),
        "inorderseq": "3",
        "datacontenttype": "application/json",
    }
    return CloudEvent(attributes={**base, **attributes}, data=PAYLOAD)


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_an_sdk_producer_s_cloudevent_becomes_an_event(mode: str) -> None:
    """Binary or structured, written with the SDK: id, type, subject, version, time, payload."""
    write = ce_kafka.to_binary if mode == "binary" else ce_kafka.to_structured
    message = write(_sdk_event(), JSONFormat())
    translated = cloudevents.envelope(list(message.headers.items()), message.value)
    assert translated is not None
    event = schemas.decode(translated)
    assert (event.event_id, event.event_type) == ("e-1", "subscription.noted")
    assert (event.entity_type, event.entity_id, event.version) == ("subscription", "s9", (1, 3))
    assert event.occurred_at == event.published_at
    assert datetime.fromisoformat(event.occurred_at) == datetime.fromisoformat(
        "2026-12-01T10:00:00+00:00"
    )
    assert event.payload == PAYLOAD


def test_a_sequence_of_inorder_s_shape_orders_without_the_extensions() -> None:
    """No inorderseq, but sequence 4-12: generation 4, seq 12."""
    attributes = {"sequence": cloudevents.sequence(4, 12)}
    message = ce_kafka.to_binary(_sdk_event(**attributes, inorderseq=None), JSONFormat())
    headers = [(k, v) for k, v in message.headers.items() if k != "ce_inorderseq"]
    translated = cloudevents.envelope(headers, message.value)
    assert translated is not None
    assert schemas.decode(translated).version == (4, 12)


def test_a_message_without_cloudevent_headers_is_not_one() -> None:
    """Plain JSON with other headers: None, the caller's own error stands."""
    assert cloudevents.envelope([("trace", b"t")], b'{"a": 1}') is None
    assert cloudevents.envelope(None, b"x") is None


@pytest.mark.parametrize(
    ("headers", "value", "reason"),
    [
        (
            {"ce_specversion": b"1.0", "ce_id": b"1", "ce_type": b"a.b", "ce_time": b"t"},
            b"{}",
            "missing_field",
        ),
        ({"ce_specversion": b"0.3", "ce_id": b"1"}, b"{}", "bad_format"),
        (
            {
                "ce_specversion": b"1.0",
                "ce_id": b"1",
                "ce_type": b"a.b",
                "ce_time": b"t",
                "ce_subject": b"nocolon",
            },
            b"{}",
            "bad_format",
        ),
        (
            {
                "ce_specversion": b"1.0",
                "ce_id": b"1",
                "ce_type": b"a.b",
                "ce_time": b"t",
                "ce_subject": b"a:b",
            },
            b"{}",
            "missing_field",
        ),
        (
            {
                "ce_specversion": b"1.0",
                "ce_id": b"1",
                "ce_type": b"a.b",
                "ce_time": b"t",
                "ce_subject": b"a:b",
                "ce_inorderseq": b"-1",
            },
            b"{}",
            "wrong_type",
        ),
        ({"ce_specversion": b"1.0", "ce_id": b"\xff"}, b"{}", "invalid_utf8"),
        ({"ce_specversion": b"1.0", "content-type": b"text/plain"}, b"hi", "bad_format"),
        ({"ce_specversion": b"1.0"}, b"{not json", "not_json"),
        ({"content-type": b"application/cloudevents+json"}, b"[1]", "not_object"),
        (
            {"content-type": b"application/cloudevents+json"},
            b'{"specversion": "1.0", "data_base64": "AA=="}',
            "bad_format",
        ),
    ],
)
def test_a_cloudevent_inorder_cannot_order_is_refused_with_the_reason(
    headers: dict[str, bytes], value: bytes, reason: str
) -> None:
    """No sequence, another specversion, a subject without its colon, bad text: DecodeError."""
    with pytest.raises(DecodeError) as caught:
        cloudevents.envelope(list(headers.items()), value)
    assert caught.value.reason == reason


# Besides any short text: numbers at and past what the columns hold, and data nesting
# past what orjson writes (254) but within what it reads (1,024).
_edges = st.sampled_from(
    [b"9223372036854775807", b"9223372036854775808", b"99999999999999999999", b"0",
     b"1-99999999999999999999", b"00000000000000000001-18446744073709551616",
     b"[" * 300 + b"]" * 300, b'{"a":' * 600 + b"1" + b"}" * 600]
)  # fmt: skip
_text = st.one_of(st.binary(max_size=30), st.text(max_size=30).map(str.encode), _edges)
_names = st.sampled_from(
    ["ce_specversion", "ce_id", "ce_type", "ce_subject", "ce_time", "ce_inorderseq",
     "ce_inordergeneration", "ce_sequence", "content-type", "other"]
)  # fmt: skip


@settings(max_examples=400)
@given(
    headers=st.lists(st.tuples(_names, st.one_of(st.none(), _text)), max_size=10),
    value=st.one_of(st.none(), _text, st.just(b'{"specversion":"1.0","data":{}}')),
)
def test_any_headers_and_value_give_an_envelope_none_or_a_decode_error(
    headers: list[tuple[str, bytes | None]], value: bytes | None
) -> None:
    """Whatever a producer sends: an envelope the codec then checks, None, or DecodeError."""
    try:
        translated = cloudevents.envelope(headers, value)
    except DecodeError:
        return
    if translated is not None:
        with contextlib.suppress(DecodeError):  # the codec's own refusal is fine too
            schemas.decode(translated)


_VALID = {
    "ce_specversion": b"1.0",
    "ce_id": b"e-1",
    "ce_type": b"ledger.noted",
    "ce_time": b"2026-12-01T10:00:00Z",
    "ce_subject": b"ledger:a",
    "ce_inorderseq": b"2",
}


@settings(max_examples=400)
@given(
    changed=st.dictionaries(_names, _text, max_size=3),
    value=st.one_of(st.just(b"{}"), _text),
)
def test_a_valid_cloudevent_changed_anywhere_is_read_or_refused_never_raised(
    changed: dict[str, bytes], value: bytes
) -> None:
    """A valid CloudEvent with attributes or data set to edge values: read, or DecodeError only."""
    with contextlib.suppress(DecodeError):
        cloudevents.decode_message(value, list({**_VALID, **changed}.items()))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ce_inorderseq", b"99999999999999999999"),
        ("ce_inorderseq", b"9223372036854775808"),
        ("ce_inordergeneration", b"18446744073709551616"),
    ],
)
def test_a_version_past_what_a_bigint_holds_is_refused_out_of_range(
    name: str, value: bytes
) -> None:
    """A 19- or 20-digit number past 2^63 - 1: out_of_range, before anything writes it."""
    with pytest.raises(DecodeError) as caught:
        cloudevents.decode_message(b"{}", list({**_VALID, name: value}.items()))
    assert (caught.value.reason, caught.value.field) == ("out_of_range", name[3:])


def test_a_sequence_past_a_bigint_is_refused_out_of_range() -> None:
    """``ce_sequence`` 1-(2^64): out_of_range, as the extensions are."""
    found = {k: v for k, v in _VALID.items() if k != "ce_inorderseq"}
    found["ce_sequence"] = b"00000000000000000001-18446744073709551616"
    with pytest.raises(DecodeError) as caught:
        cloudevents.decode_message(b"{}", list(found.items()))
    assert caught.value.reason == "out_of_range"


def test_the_largest_version_a_bigint_holds_is_read() -> None:
    """2^63 - 1 is still a version: the bound is the column's, not one short of it."""
    found = {**_VALID, "ce_inorderseq": b"9223372036854775807"}
    event, _ = cloudevents.decode_message(b"{}", list(found.items()))
    assert event.seq == 2**63 - 1


@pytest.mark.parametrize("depth", [129, 254, 255, 600, 1023])
@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_data_nesting_past_the_limit_is_refused_too_deep(depth: int, mode: str) -> None:
    """Data nesting 129..1,023 deep (orjson reads it, cannot write it): too_deep, no TypeError."""
    data = b"[" * depth + b"]" * depth
    if mode == "binary":
        headers, value = list(_VALID.items()), b'{"a":' + data + b"}"
    else:
        attributes = {k[3:]: v.decode() for k, v in _VALID.items()}
        value = orjson.dumps({**attributes, "data": {}}).replace(b"{}", b'{"a":' + data + b"}")
        headers = [("content-type", b"application/cloudevents+json")]
    with pytest.raises(DecodeError) as caught:
        cloudevents.decode_message(value, headers)
    assert caught.value.reason == "too_deep"


def test_an_attribute_said_twice_two_ways_is_refused_as_ambiguous() -> None:
    """Two ce_inorderseq headers, 2 and 3: which version is meant cannot be known."""
    headers = [*_VALID.items(), ("ce_inorderseq", b"3")]
    with pytest.raises(DecodeError) as caught:
        cloudevents.decode_message(b"{}", headers)
    assert caught.value.reason == "ambiguous"
    same = [*_VALID.items(), ("ce_inorderseq", b"2")]  # repeated alike: one meaning
    assert cloudevents.decode_message(b"{}", same)[0].seq == 2


def test_whatever_a_translation_raises_is_a_decode_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error no check foresaw (here a serializer's) refuses that message: DecodeError."""

    def broken(_: Any) -> bytes:
        raise TypeError("Integer exceeds 64-bit range")

    monkeypatch.setattr(cloudevents.orjson, "dumps", broken)
    with pytest.raises(DecodeError) as caught:
        cloudevents.decode_message(b"{}", list(_VALID.items()))
    assert caught.value.reason == "bad_format"
    assert "TypeError" in caught.value.detail


@pytest.mark.parametrize(
    "name", ["ce_id", "ce_subject", "ce_inorderseq", "CE_SEQUENCE", "ce_source", "content-type"]
)
def test_a_row_s_headers_never_say_which_event_it_is(name: str) -> None:
    """CloudEvents mode: a row whose headers name an identity attribute is failed bad_headers."""
    registry = schemas.PayloadSchemas(allow_unknown=True)
    row = _row(headers={name: "99"})
    messages, problems = to_messages(
        [row], NOW, schemas=registry, max_bytes=10_000, cloudevents=True
    )
    assert messages == []
    [(_, problem)] = problems
    assert problem.reason == "bad_headers"
    assert name in problem.detail
    other = _row(headers={"ce_tenant": "t1"})  # an extension of the writer's own passes
    assert _sent(other, cloud=True)[2][-1] == ("ce_tenant", "t1")


def test_a_message_is_read_as_inorder_s_envelope_first_then_as_a_cloudevent() -> None:
    """Envelope: read whatever its headers say; CloudEvent: translated; neither: the codec's no."""
    _, envelope_value, _ = _sent(_row(), cloud=False)
    _, value, headers = _sent(_row(), cloud=True)
    event, kept = cloudevents.decode_message(envelope_value, [("ce_specversion", b"0.1")])
    assert kept == envelope_value
    translated, parked = cloudevents.decode_message(value, headers)
    assert translated == event
    assert schemas.decode(parked) == event  # what a step route parks is inorder's envelope
    with pytest.raises(DecodeError) as caught:
        cloudevents.decode_message(b'{"a": 1}', [("trace", b"t")])
    assert caught.value.reason == "missing_field"
