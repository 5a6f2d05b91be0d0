"""The relay's pure decisions: row to message, failure reasons, republish bounds and cooldown."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

import schemas
from outbox_relay.errors import RowProblem
from outbox_relay.republisher import MAX_RANGE, Cooldown, bounded
from outbox_relay.rows import OutboxRow, to_messages
from schemas import headers
from schemas.republish import RepublishRequest, backoff_delays, worst_case_repair_s

NOW = orjson.dumps(datetime(2026, 11, 30, 12, 0, tzinfo=UTC).isoformat()).decode()
PAYLOAD = {"plan": "pro", "price_cents": 2900, "status": "active"}


def _row(**changes: Any) -> OutboxRow:
    fields: dict[str, Any] = {
        "id": 7,
        "topic": "events",
        "entity_type": "subscription",
        "entity_id": "s1",
        "generation": 2,
        "seq": 5,
        "event_type": "subscription.plan_changed",
        "event_id": "subscription:s1:2:5",
        "payload": orjson.dumps(PAYLOAD).decode(),
        "headers": {"trace": "t"},
        "occurred_at": '"2026-11-30T11:59:00+00:00"',
        "slice": 3,
        "xid": 1000,
    }
    return OutboxRow(**{**fields, **changes})


def _messages(rows: list[OutboxRow], **kwargs: Any) -> Any:
    return to_messages(
        rows, NOW, schemas=schemas.default_payload_schemas(), max_bytes=10_000, **kwargs
    )


def _message(row: OutboxRow, **kwargs: Any) -> Any:
    """The one message made of ``row``, or the RowProblem it raised."""
    messages, problems = _messages([row], **kwargs)
    if problems:
        raise problems[0][1]
    [(row_id, topic, key, value, sent_headers)] = messages
    return SimpleNamespace(row_id=row_id, topic=topic, key=key, value=value, headers=sent_headers)


def test_row_becomes_the_envelope_keyed_by_entity() -> None:
    """A row becomes an envelope the codec accepts, keyed entity_type:entity_id, with headers."""
    message = _message(_row())
    event = schemas.decode(message.value)
    assert (message.row_id, message.topic, message.key) == (7, "events", b"subscription:s1")
    assert (event.version, event.payload) == ((2, 5), PAYLOAD)
    assert event.occurred_at == "2026-11-30T11:59:00+00:00"
    assert event.published_at == "2026-11-30T12:00:00+00:00"
    assert message.headers == [
        (headers.EVENT_TYPE, b"subscription.plan_changed"),
        (headers.ENTITY_TYPE, b"subscription"),
        ("trace", "t"),
    ]


def test_republished_row_carries_the_request_id() -> None:
    """A re-sent row is marked with the republish request's id."""
    message = _message(_row(), republish_request="req-1")
    assert message.headers[-1] == (headers.REPUBLISH_REQUEST, "req-1")


def test_event_types_without_a_schema_pass_unchecked() -> None:
    """An application's own event type with no registered schema is sent as it is."""
    message = _message(_row(event_type="billing.invoice_sent", payload='{"any": [1, 2]}'))
    assert schemas.decode(message.value).payload == {"any": [1, 2]}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"payload": '{"plan": "gold", "price_cents": 1, "status": "active"}'}, "payload_schema"),
        ({"headers": {"n": 5}}, "bad_headers"),
        ({"headers": ["x"]}, "bad_headers"),
        ({"event_type": "x.y", "payload": '{"blob": "%s"}' % ("z" * 20_000)}, "too_large"),
    ],
)
def test_rows_that_cannot_be_sent_say_why(changes: dict[str, Any], reason: str) -> None:
    """Each kind of unsendable row raises RowProblem with its own reason."""
    with pytest.raises(RowProblem) as caught:
        _message(_row(**changes))
    assert caught.value.reason == reason


def test_a_batch_keeps_its_order_and_sets_aside_only_the_bad_rows() -> None:
    """Bad rows come back with their reasons; the rest become messages in the rows' order."""
    rows = [
        _row(id=1, headers=None),
        _row(id=2, headers={"n": 5}),
        _row(id=3, headers=None, entity_id="s2", event_id="subscription:s2:2:5"),
        _row(id=4, payload='{"plan": "gold", "price_cents": 1, "status": "active"}'),
        _row(id=5, headers={"trace": "u"}),
    ]
    messages, problems = _messages(rows)
    assert [m[0] for m in messages] == [1, 3, 5]
    assert [(row.id, problem.reason) for row, problem in problems] == [
        (2, "bad_headers"),
        (4, "payload_schema"),
    ]
    assert [m[2] for m in messages] == [b"subscription:s1", b"subscription:s2", b"subscription:s1"]
    assert (
        messages[0][4]
        == messages[1][4]
        == [
            (headers.EVENT_TYPE, b"subscription.plan_changed"),
            (headers.ENTITY_TYPE, b"subscription"),
        ]
    )
    assert messages[2][4][-1] == ("trace", "u")


def test_large_requests_are_answered_in_bounded_parts() -> None:
    """A request over MAX_RANGE seqs is answered for its first MAX_RANGE seqs only."""
    request = RepublishRequest("r", "subscription", "s1", 1, 5, 10**9, "gap")
    part = bounded(request)
    assert (part.from_seq, part.to_seq) == (5, 5 + MAX_RANGE - 1)
    small = RepublishRequest("r", "subscription", "s1", 1, 5, 9, "gap")
    assert bounded(small) is small


def test_cooldown_remembers_a_range_for_its_window() -> None:
    """A range is recent within the window and forgotten after it."""
    now = [100.0]
    cooldown = Cooldown(30.0, clock=lambda: now[0])
    key = ("subscription", "s1", 1, 3, 7)
    assert not cooldown.recent(key)
    cooldown.note(key)
    now[0] = 129.0
    assert cooldown.recent(key)
    now[0] = 131.0
    assert not cooldown.recent(key)


def test_backoff_doubles_up_to_its_cap_and_bounds_repairs() -> None:
    """Republish waits double from the base up to the cap; the worst case adds the deadline."""
    assert backoff_delays(30, 100, 5) == [30, 60, 100, 100, 100]
    assert worst_case_repair_s(300, 30, 100, 5) == 300 + 390
