"""Trace context in headers and in stored values: read, stamped and read back, never raising."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import Event, decode, encode, tracing

WHEN = "2026-12-03T10:00:00Z"
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _value() -> bytes:
    return encode(Event("e:1", "ledger.added", "ledger", "e", 1, 2, WHEN, WHEN, {"n": 1}))


def test_a_w3c_traceparent_in_kafka_headers_names_the_creation_context() -> None:
    """Bytes or text, with a tracestate: the context is the one the header names."""
    found = tracing.creation_context([("traceparent", PARENT.encode()), ("tracestate", b"a=1")])
    assert (found.trace_id, found.span_id, int(found.trace_flags)) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        1,
    )
    assert found.is_remote
    assert found.trace_state.get("a") == "1"
    assert tracing.creation_context({"traceparent": PARENT}).span_id == 0xB7AD6B7169203331


def test_invalid_traceparents_name_no_context() -> None:
    """Zero ids, the forbidden version, wrong lengths and non-hex give None."""
    for bad in (
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
        "00-zzf7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "",
    ):
        assert tracing.creation_context([("traceparent", bad)]) is None, bad
    assert tracing.creation_context(None) is None
    assert tracing.creation_context([("other", b"x")]) is None


def test_a_stamped_value_decodes_as_before_and_gives_back_its_context_time_and_distance() -> None:
    """The codec ignores the stamp; ``waited`` reads the context, the time and the distance."""
    value = _value()
    stamped = tracing.with_distance(tracing.stamp(value, [("traceparent", PARENT.encode())]), 3)
    assert decode(stamped) == decode(value)
    found = tracing.waited(stamped)
    assert found is not None
    context, began, distance = found
    assert (context.span_id, distance) == (0xB7AD6B7169203331, 3)
    assert began > 0
    assert tracing.stamp(stamped, [("traceparent", PARENT)]) == stamped  # once only


def test_values_without_a_context_or_not_an_object_are_left_as_they_are() -> None:
    """No traceparent, or a value that is not a JSON object: nothing is added."""
    value = _value()
    assert tracing.stamp(value, None) == value
    assert tracing.stamp(value, [("tracestate", b"a=1")]) == value
    assert tracing.stamp(b"[1, 2]", [("traceparent", PARENT)]) == b"[1, 2]"
    assert tracing.with_distance(value, 2) == value
    assert tracing.waited(value) is None


@given(st.binary(max_size=300), st.text(max_size=80))
def test_reading_any_stored_value_or_header_never_raises(value: bytes, header: str) -> None:
    """Whatever a parked value or a traceparent header holds, reading it returns or gives None."""
    tracing.waited(value)
    tracing.waited(b'{"inorder_trace":{' + value)
    tracing.creation_context([("traceparent", header)])
    tracing.creation_context([("traceparent", header.encode("utf-8", "surrogatepass"))])


def test_the_first_traceparent_of_a_message_is_the_writer_s() -> None:
    """A Kafka instrumentation's own traceparent after the row's does not replace it."""
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    found = tracing.creation_context([("traceparent", PARENT), ("traceparent", other)])
    assert found.span_id == 0xB7AD6B7169203331


def test_a_remote_context_made_current_is_what_code_in_the_block_sees() -> None:
    """``continuing`` makes a message's context current for the block only."""
    found = tracing.creation_context([("traceparent", PARENT)])
    with tracing.continuing(found):
        assert tracing.current_traceparent() == PARENT
    assert tracing.current_traceparent() is None
    with tracing.continuing(None):
        assert tracing.current_traceparent() is None


@settings(max_examples=100, deadline=None)
@given(
    state=st.one_of(st.text(max_size=600), st.text(min_size=5000, max_size=6000)),
    parent=st.one_of(st.text(max_size=80), st.text(min_size=600, max_size=700)),
)
def test_a_stamp_adds_at_most_its_room_whatever_the_headers_hold(state: str, parent: str) -> None:
    """Any trace headers (long ones left out): a stamp adds STAMP_ROOM bytes at most."""
    value = _value()
    stamped = tracing.stamp(value, [("traceparent", PARENT), ("tracestate", state.encode())])
    assert len(stamped) - len(value) <= tracing.STAMP_ROOM
    odd = tracing.stamp(value, [("traceparent", parent), ("tracestate", state)])
    assert len(odd) - len(value) <= tracing.STAMP_ROOM
