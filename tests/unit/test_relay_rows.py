"""The relay's pure decisions: row to message, failure reasons, republish bounds and cooldown."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

import schemas
from outbox_relay.errors import RowProblem
from outbox_relay.republisher import MAX_RANGE, Cooldown, bounded
from outbox_relay.rows import OutboxRow, to_messages
from outbox_relay.topics import TopicCheck, TopicVerdict, name_problem
from schemas import headers
from schemas.limits import MAX_DEPTH
from schemas.republish import RepublishRequest, backoff_delays, worst_case_repair_s
from schemas.runtime.payloads import default_payload_schemas
from tests.support.outbox_rows import NOW, PAYLOAD
from tests.support.outbox_rows import outbox_row as _row

# Unknown event types allowed: for rows whose type only carries a payload to a limit.
ALLOWING = schemas.PayloadSchemas(allow_unknown=True)


def _messages(
    rows: list[OutboxRow], registry: schemas.PayloadSchemas | None = None, **kwargs: Any
) -> Any:
    registry = registry or default_payload_schemas()
    return to_messages(rows, NOW, schemas=registry, max_bytes=10_000, **kwargs)


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


def test_event_types_without_a_schema_are_refused_naming_the_settings() -> None:
    """By default a type with no schema fails its row unknown_type, saying how to add one."""
    with pytest.raises(RowProblem) as caught:
        _message(_row(event_type="billing.invoice_sent", payload='{"any": [1, 2]}'))
    assert caught.value.reason == "unknown_type"
    assert "INORDER_PAYLOAD_SCHEMAS" in caught.value.detail
    assert "INORDER_UNKNOWN_EVENT_TYPES=allow" in caught.value.detail


def test_event_types_without_a_schema_pass_unchecked_when_allowed() -> None:
    """With unknown types allowed, a type with no schema is sent as it is."""
    row = _row(event_type="billing.invoice_sent", payload='{"any": [1, 2]}')
    message = _message(row, registry=ALLOWING)
    assert schemas.decode(message.value).payload == {"any": [1, 2]}


def test_a_folder_type_is_checked_against_its_schema(tmp_path: Path) -> None:
    """A type from the schema folder is sent when its payload matches, refused when not."""
    (tmp_path / "billing.invoice_sent.schema.json").write_bytes(
        orjson.dumps({"type": "object", "required": ["total"]})
    )
    registry = schemas.PayloadSchemas.configured(tmp_path, allow_unknown=False)
    good = _row(event_type="billing.invoice_sent", payload='{"total": 3}')
    assert schemas.decode(_message(good, registry=registry).value).payload == {"total": 3}
    with pytest.raises(RowProblem) as caught:
        _message(_row(event_type="billing.invoice_sent", payload="{}"), registry=registry)
    assert caught.value.reason == "payload_schema"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"payload": '{"plan": "gold", "price_cents": 1, "status": "active"}'}, "payload_schema"),
        ({"headers": {"n": 5}}, "bad_headers"),
        ({"headers": ["x"]}, "bad_headers"),
        ({"headers": '{"n": 5}'}, "bad_headers"),
        ({"headers": "[" * 1100 + "]" * 1100}, "bad_headers"),
        ({"headers": '{"a": ' * 300 + '"x"' + "}" * 300}, "bad_headers"),
        ({"event_type": "x.y", "payload": '{"d":' * 200 + "0" + "}" * 200}, "too_deep"),
        ({"event_type": "x.y", "payload": '{"d":' * 1100 + "0" + "}" * 1100}, "too_deep"),
        ({"event_type": "x.y", "payload": '{"blob": "%s"}' % ("z" * 20_000)}, "too_large"),
    ],
)
def test_rows_that_cannot_be_sent_say_why(changes: dict[str, Any], reason: str) -> None:
    """Each kind of unsendable row raises RowProblem with its own reason."""
    with pytest.raises(RowProblem) as caught:
        _message(_row(**changes), registry=ALLOWING)
    assert caught.value.reason == reason


def test_headers_read_as_json_text_become_kafka_headers() -> None:
    """Headers come from the read as JSON text and go out as the same pairs."""
    message = _message(_row(headers='{"traceparent": "00-ab-cd-01"}'))
    assert message.headers[-1] == ("traceparent", "00-ab-cd-01")


def test_a_row_naming_a_topic_that_cannot_be_written_is_refused() -> None:
    """The topic check's verdict fails the rows naming that topic, and only those."""
    refused = RowProblem("unknown_topic", "topic 'nope' does not exist in the cluster")
    rows = [_row(id=1), _row(id=2, topic="nope"), _row(id=3, entity_id="s9")]
    messages, problems = _messages(rows, topic_problems={"nope": refused})
    assert [m[0] for m in messages] == [1, 3]
    assert [(r.id, p.reason) for r, p in problems] == [(2, "unknown_topic")]


def test_whatever_else_one_row_raises_refuses_that_row_only() -> None:
    """A value no step expected (an id that is not text) fails its row; the batch goes on."""
    rows = [_row(id=1), _row(id=2, entity_id=12345), _row(id=3, headers=None)]
    messages, problems = _messages(rows)
    assert [m[0] for m in messages] == [1, 3]
    [(row, problem)] = problems
    assert (row.id, problem.reason) == (2, "unsendable")
    assert "TypeError" in problem.detail


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


@pytest.mark.parametrize(
    ("topic", "allowed", "reason"),
    [
        ("events", None, None),
        ("a.b_c-D9", None, None),
        ("x" * 249, None, None),
        ("x" * 250, None, "bad_topic"),
        ("", None, "bad_topic"),
        (".", None, "bad_topic"),
        ("..", None, "bad_topic"),
        ("with space", None, "bad_topic"),
        ("nul\x00", None, "bad_topic"),
        ("ünï", None, "bad_topic"),
        ("events", frozenset({"events"}), None),
        ("other", frozenset({"events"}), "topic_not_allowed"),
        ("res", None, "protocol_topic"),
        ("req", None, "protocol_topic"),
        ("res", frozenset({"events", "res"}), "protocol_topic"),
        ("res.x", None, None),
    ],
)
def test_topic_names_are_held_to_kafkas_rules_and_the_allow_list(
    topic: str, allowed: frozenset[str] | None, reason: str | None
) -> None:
    """A topic name Kafka would refuse, one not allowed or a protocol topic is refused."""
    problem = name_problem(topic, allowed, frozenset({"req", "res"}))
    assert (problem.reason if problem else None) == reason


@pytest.mark.parametrize(("levels", "sent"), [(MAX_DEPTH - 1, True), (MAX_DEPTH, False)])
def test_the_relay_sends_a_payload_exactly_when_the_consumer_can_read_its_envelope(
    levels: int, sent: bool
) -> None:
    """The payload's limit is one level under the document's: what goes out, decodes."""
    payload = '{"d":' * levels + "0" + "}" * levels
    messages, problems = _messages([_row(event_type="x.y", payload=payload)], ALLOWING)
    assert bool(messages) is sent
    if sent:
        assert schemas.decode(messages[0][3]).event_type == "x.y"
    else:
        assert problems[0][1].reason == "too_deep"


class _Metadata:
    def __init__(self, topics: set[str]) -> None:
        self.topics = dict.fromkeys(topics)


class _Cluster:
    """Stands in for the producer's metadata call: the topics the cluster has now."""

    def __init__(self, *topics: str) -> None:
        self.topics = set(topics)
        self.asked = 0

    def list_topics(self, timeout: float) -> _Metadata:
        self.asked += 1
        return _Metadata(self.topics)


def test_a_missing_topic_sets_its_rows_aside_and_a_new_one_is_found() -> None:
    """Missing: its rows are set aside at once (no slice waits); created meanwhile: they go."""
    cluster = _Cluster("events")
    check = TopicCheck(cluster, None, grace_s=60)  # type: ignore[arg-type]
    assert check.check(["events"]) == TopicVerdict()
    verdict = check.check(["events", "later", "never"])
    assert {t: p.reason for t, p in verdict.refused.items()} == {
        "later": "awaiting_topic",
        "never": "awaiting_topic",
    }
    cluster.topics.add("later")
    verdict = check.check(["later", "never", "bad name"])
    assert {t: p.reason for t, p in verdict.refused.items()} == {
        "never": "awaiting_topic",
        "bad name": "bad_topic",
    }


def test_known_topics_cost_no_request() -> None:
    """The cluster is asked only when a batch names a topic not known yet."""
    cluster = _Cluster("events")
    check = TopicCheck(cluster, None, grace_s=60)  # type: ignore[arg-type]
    for _ in range(5):
        check.check(["events"])
    assert cluster.asked == 1
