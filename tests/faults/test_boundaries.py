"""One bad input at each boundary, sent as a hostile or buggy producer would, to every replica.

Each input is valid JSON, or a row the table takes, and carries a value at the edge of
what PostgreSQL, orjson and the column types accept. The processes run as their
console scripts, two of each where a replica would meet the same input in turn. Each
input must be refused with its reason, every process must stay up (``/healthz`` 200,
none exited), and a valid input sent after it must take effect.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Producer
from psycopg import sql

from producer import subscriptions as subs
from schemas import encode
from schemas.limits import MAX_DEPTH
from tests.faults.mutations import valid_event
from tests.faults.pipeline import Pipeline
from tests.faults.test_faults import start

pytestmark = [pytest.mark.faults, pytest.mark.services, pytest.mark.timeout(600)]

CONSUMERS = ("consumer-1", "consumer-2")


def labelled(pipeline: Pipeline, names: tuple[str, ...], sample: str, **labels: str) -> float:
    """One sample summed over ``names``' /metrics, only where its labels include ``labels``."""
    return sum(
        value
        for found, value in pipeline.samples(names, sample)
        if all(found.get(k) == v for k, v in labels.items())
    )


def all_up(pipeline: Pipeline) -> None:
    """No process exited, and every one still answers /healthz."""
    assert pipeline.crashed() == [], f"exited: {pipeline.crashed()}; logs {pipeline.logs}"
    for name, process in pipeline.processes.items():
        if not process.killed:
            assert pipeline.http(name, "/healthz")[0] == 200, f"{name}; logs {pipeline.logs}"


def produce(pipeline: Pipeline, topic: str, values: list[tuple[bytes, bytes]]) -> None:
    """Send raw (key, value) pairs as a client that is not ours would."""
    producer = Producer({"bootstrap.servers": pipeline.services.kafka_bootstrap})
    for key, value in values:
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0


def envelope(fid: int, **changes: object) -> bytes:
    """A valid subscription envelope with fields changed."""
    doc = orjson.loads(encode(valid_event(fid)))
    doc.update(changes)
    return orjson.dumps(doc)


def deep_payload(fid: int, levels: int) -> bytes:
    """A valid envelope whose mapped field ``plan`` nests ``levels`` deep (made as text)."""
    text = envelope(fid)
    return text.replace(b'"plan":"', b'"plan":' + b'{"d":' * levels + b'"', 1).replace(
        b'","price_cents"', b'"' + b"}" * levels + b',"price_cents"', 1
    )


# Name -> (message value, the reason the consumers must give).
EVENTS: dict[str, tuple[bytes, str]] = {
    "NUL in entity_id": (envelope(1, entity_id="x\u0000y"), "nul_in_text"),
    "NUL in event_id": (envelope(2, event_id="e\u0000"), "nul_in_text"),
    "NUL in a step entity": (
        envelope(3, entity_type="seat_ledger", event_type="seat_ledger.opened", entity_id="\x00"),
        "nul_in_text",
    ),
    "NUL in a mapped payload field": (envelope(4, payload={"plan": "p\x00"}), "nul_in_text"),
    "NUL in a payload key": (envelope(5, payload={"\x00": 1}), "nul_in_text"),
    "mapped field nested 300 deep": (deep_payload(6, 300), "too_deep"),
    "mapped field nested one past the limit": (deep_payload(7, MAX_DEPTH), "too_deep"),
    "escaped lone surrogate": (
        envelope(8).replace(b'"entity_id":"', b'"entity_id":"\\ud800', 1),
        "lone_surrogate",
    ),
    "seq 2^63": (envelope(9, seq=2**63), "out_of_range"),
    "generation 2^63": (envelope(10, generation=2**63), "out_of_range"),
    "price past the column": (
        envelope(11, payload={"plan": "pro", "price_cents": 2**40, "status": "active"}),
        "projection_rejected",
    ),
}


def test_one_bad_event_stops_no_consumer(pipeline: Pipeline) -> None:
    """Each class of bad event is dead-lettered by one consumer of two; later events apply."""
    start(pipeline, "relay-1", *CONSUMERS, "sweeper-1")
    produce(pipeline, pipeline.events_topic, [(b"k", value) for value, _ in EVENTS.values()])
    reasons: dict[str, int] = {}
    for _, reason in EVENTS.values():
        reasons[reason] = reasons.get(reason, 0) + 1

    def all_refused() -> bool:
        return all(
            labelled(pipeline, CONSUMERS, "events_dead_lettered_total", reason=r) >= n
            for r, n in reasons.items()
        )

    pipeline.wait_for("every bad event dead-lettered", all_refused, timeout=90)
    entity = f"after-{uuid.uuid4().hex[:6]}"
    with pipeline.db.connect() as conn:
        subs.create_subscription(conn, entity, "pro", topic=pipeline.events_topic)
    pipeline.wait_for("the event after them applied", lambda: _in_view(pipeline, entity))
    all_up(pipeline)
    assert labelled(pipeline, CONSUMERS, "events_dead_lettered_total") == len(EVENTS)


def _in_view(pipeline: Pipeline, entity: str) -> bool:
    with pipeline.db.connect() as conn:
        return (
            conn.execute(
                "SELECT 1 FROM billing_view WHERE subscription_id = %s", (entity,)
            ).fetchone()
            is not None
        )


def _request(entity: str, **changes: object) -> bytes:
    doc: dict[str, object] = {
        "request_id": f"r-{uuid.uuid4().hex[:6]}",
        "entity_type": "seat_ledger",
        "entity_id": entity,
        "generation": 1,
        "from_seq": 1,
        "to_seq": 2,
        "reason": "test",
    }
    return orjson.dumps({**doc, **changes})


def _result(entity: str, **changes: object) -> bytes:
    doc: dict[str, object] = {
        "request_id": "r-1",
        "entity_type": "seat_ledger",
        "entity_id": entity,
        "generation": 1,
        "from_seq": 1,
        "to_seq": 2,
        "resent": [],
        "missing": [1],
        "failed": [],
        "cooldown": False,
    }
    return orjson.dumps({**doc, **changes})


BAD_REQUESTS = [
    _request("x\u0000y"),
    _request("x", request_id="\u0000"),
    _request("x", reason="why\u0000"),
    _request("x", to_seq=2**63),
    _request("x", generation=2**63),
    _request("x", from_seq=5, to_seq=4),
    _request("x", request_id=[[[1]]]),
    b'{"request_id":"' + b"\\ud800" + b'"}',
]
BAD_RESULTS = [
    _result("x\u0000y"),
    _result("x", missing=[2**63]),
    _result("x", generation=2**63),
    _result("x", missing=list(range(1, 10_002))),
    _result("x").replace(b'"request_id":"r-1"', b'"request_id":"\\ud800"'),
]


def test_bad_protocol_messages_stop_no_relay_and_no_sweeper(pipeline: Pipeline) -> None:
    """Requests and results no store can take are counted invalid by both replicas; repair works."""
    start(pipeline, "relay-1", "relay-2", *CONSUMERS, "sweeper-1", "sweeper-2")
    pipeline.wait_for("a sweeper active", lambda: _sweepers_active(pipeline) == 1)
    requests, results = (
        pipeline.env["INORDER_REPUBLISH_REQUESTS_TOPIC"],
        pipeline.env["INORDER_REPUBLISH_RESULTS_TOPIC"],
    )
    produce(pipeline, requests, [(b"seat_ledger:x", v) for v in BAD_REQUESTS])
    produce(pipeline, results, [(b"seat_ledger:x", v) for v in BAD_RESULTS])
    relays, sweepers = ("relay-1", "relay-2"), ("sweeper-1", "sweeper-2")
    pipeline.wait_for(
        "every bad request counted invalid",
        lambda: (
            labelled(pipeline, relays, "outbox_republish_requests_total", outcome="invalid")
            >= len(BAD_REQUESTS)
        ),
    )
    pipeline.wait_for(
        "every bad result counted invalid",
        lambda: (
            labelled(pipeline, sweepers, "republish_results_total", outcome="invalid")
            >= len(BAD_RESULTS)
        ),
    )
    all_up(pipeline)
    # A valid request and its result after them: a lost event is found and healed.
    entity = f"heal-{uuid.uuid4().hex[:6]}"
    pipeline.lose_one_event(entity)
    pipeline.settle(timeout=120)
    with pipeline.db.connect() as conn:
        healed = conn.execute(
            "SELECT count(*) FROM inorder_gaps WHERE entity_id = %s AND status = 'healed'",
            (entity,),
        ).fetchone()
    assert healed == (1,), f"logs {pipeline.logs}"
    all_up(pipeline)


def _sweepers_active(pipeline: Pipeline) -> float:
    return labelled(pipeline, ("sweeper-1", "sweeper-2"), "sweeper_active")


ROW = (
    "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload,"
    " headers) VALUES (%s, 'subscription', %s, 1, 'subscription.plan_changed', %s, %s, %s)"
)
GOOD = '{"plan": "pro", "price_cents": 900, "status": "active"}'


def _older(conn: psycopg.Connection[Any], values: tuple[str, ...], **changed: str) -> None:
    """A row as one written before the table's rules holds it: written, then changed, in one
    transaction (the rules hold what is written; the relay holds every row to its own)."""
    with conn.transaction():
        conn.execute(ROW, values)
        for column, value in changed.items():
            conn.execute(
                sql.SQL("UPDATE outbox SET {} = %s WHERE event_id = %s").format(
                    sql.Identifier(column)
                ),
                (value, values[2]),
            )


def _peer(conn: psycopg.Connection[Any], entity: str, prefix: str, *, same: bool) -> str:
    """An entity id starting with ``prefix`` in ``entity``'s slice (``same``) or in another."""
    row = conn.execute(
        "SELECT %s || g FROM generate_series(1, 200) g"
        " WHERE (outbox_slice('subscription', %s || g) = outbox_slice('subscription', %s)) = %s"
        " LIMIT 1",
        (prefix, prefix, entity, same),
    ).fetchone()
    assert row is not None
    return str(row[0])


def test_bad_outbox_rows_fail_alone_and_hold_no_other_slice(pipeline: Pipeline) -> None:
    """Rows from before the table's checks, a missing topic, a far-future xid: none stalls.

    The row for a missing topic is set aside at once, and failed once its grace is over.
    """
    pipeline.env["INORDER_UNKNOWN_TOPIC_GRACE_S"] = "20"
    start(pipeline, "relay-1", "relay-2", *CONSUMERS)
    topic = pipeline.events_topic
    with pipeline.db.connect(autocommit=True) as conn:
        rows = [
            (topic, "deep-headers", '{"a":' * 1100 + '"x"' + "}" * 1100),
            (topic, "nested-headers", '{"a": {"b": "c"}}'),
            ("no-such-topic-" + uuid.uuid4().hex[:6], "unknown-topic", "{}"),
            ("bad topic name", "bad-topic", "{}"),
        ]
        for row_topic, entity, hdrs in rows:
            _older(conn, (topic, entity, f"{entity}:1", GOOD, "{}"), topic=row_topic, headers=hdrs)
        after = _peer(conn, "unknown-topic", "after-", same=False)
        started = time.monotonic()
        conn.execute(ROW, (topic, after, f"{after}:1", GOOD, "{}"))
        # A far-future transaction id, as an ETL copy would bring: the table stamps its own.
        conn.execute(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id,"
            " payload, xid) VALUES (%s, 'subscription', 'future-xid', 1,"
            " 'subscription.plan_changed', 'future-xid:1', %s, '9999999999')",
            (topic, GOOD),
        )
        same = _peer(conn, "unknown-topic", "behind-", same=True)
        conn.execute(ROW, (topic, same, f"{same}:1", GOOD, "{}"))
    pipeline.wait_for("the row of another slice applied", lambda: _in_view(pipeline, after))
    waited = time.monotonic() - started
    pipeline.wait_for("the far-future row applied", lambda: _in_view(pipeline, "future-xid"))
    # The row behind the missing topic, in its slice, goes at once: that row is set aside.
    pipeline.wait_for("the row behind the missing topic", lambda: _in_view(pipeline, same))
    behind = time.monotonic() - started
    assert _reason(pipeline, "unknown-topic").startswith("awaiting_topic:")
    pipeline.wait_for(
        "the set-aside row failed past its grace",
        lambda: _reason(pipeline, "unknown-topic").startswith("unknown_topic:"),
    )
    with pipeline.db.connect() as conn:
        failed = dict(
            conn.execute(
                "SELECT entity_id, failure_reason FROM outbox WHERE failed_at IS NOT NULL"
            ).fetchall()
        )
    assert set(failed) == {"deep-headers", "nested-headers", "unknown-topic", "bad-topic"}
    assert "does not exist" in failed["unknown-topic"]
    assert "not a legal Kafka topic" in failed["bad-topic"]
    print(
        f"boundaries: a row of another slice applied {waited:.1f} s after it was written,"
        f" one behind the missing topic in its slice {behind:.1f} s"
    )
    all_up(pipeline)


def _reason(pipeline: Pipeline, entity: str) -> str:
    """The failure reason of ``entity``'s outbox row ('' when it has none)."""
    with pipeline.db.connect() as conn:
        row = conn.execute(
            "SELECT coalesce(failure_reason, '') FROM outbox WHERE entity_id = %s", (entity,)
        ).fetchone()
    return str(row[0]) if row else ""


def test_a_row_whose_payload_nests_too_deep_is_failed(pipeline: Pipeline) -> None:
    """A payload the table holds but no consumer could read is failed by the relay, not sent."""
    start(pipeline, "relay-1", "consumer-1")
    deep = '{"plan": ' + '{"d": ' * 200 + "1" + "}" * 200 + "}"
    with pipeline.db.connect(autocommit=True) as conn:
        conn.execute(ROW, (pipeline.events_topic, "deep-payload", "deep-payload:1", deep, "{}"))
        conn.execute(ROW, (pipeline.events_topic, "after-deep", "after-deep:1", GOOD, "{}"))
    pipeline.wait_for("the good row applied", lambda: _in_view(pipeline, "after-deep"))
    with pipeline.db.connect() as conn:
        row = conn.execute(
            "SELECT failure_reason FROM outbox WHERE entity_id = 'deep-payload'"
        ).fetchone()
    assert row is not None
    assert "deeper than" in row[0]
    all_up(pipeline)


def test_what_only_the_operator_can_fix_stops_the_consumer_with_one_line(
    pipeline: Pipeline,
) -> None:
    """The projection's table dropped under a running consumer: exit 3, one line naming it."""
    start(pipeline, "relay-1", "consumer-1")
    with pipeline.db.connect(autocommit=True) as conn:
        conn.execute("DROP TABLE billing_view")
        subs.create_subscription(conn, "after-drop", "pro", topic=pipeline.events_topic)
    process = pipeline.processes["consumer-1"].popen
    pipeline.wait_for("the consumer stopped", lambda: process.poll() is not None)
    assert process.returncode == 3
    lines = (pipeline.logs / "consumer-1.log").read_text().strip().splitlines()
    assert lines[-1].startswith("inorder-consumer: stopped: "), lines[-1]
    assert "billing_view" in lines[-1]
    assert not any(line.startswith("Traceback") for line in lines)
    pipeline.processes["consumer-1"].killed = True  # its exit is what this test wants


def test_rows_past_the_read_budget_or_any_message_size_stall_nothing(pipeline: Pipeline) -> None:
    """5 MB of headers: refused by the table; one written before its check, failed unread; 40
    rows of 30 KB through 64 KB reads: all applied."""
    pipeline.env["INORDER_READ_BYTES"] = str(64 * 1024)
    start(pipeline, "relay-1", "relay-2", *CONSUMERS)
    topic = pipeline.events_topic
    wide = [f"wide-{n}" for n in range(40)]
    with pipeline.db.connect(autocommit=True) as conn:
        huge = orjson.dumps({"h": "x" * 5_000_000}).decode()
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(ROW, (topic, "huge-headers", "huge-headers:1", GOOD, huge))
        _older(conn, (topic, "huge-headers", "huge-headers:1", GOOD, "{}"), headers=huge)
        for entity in wide:
            headers = orjson.dumps({"h": "y" * 30_000}).decode()
            conn.execute(ROW, (topic, entity, f"{entity}:1", GOOD, headers))
        same = _peer(conn, "huge-headers", "behind-huge-", same=True)
        conn.execute(ROW, (topic, same, f"{same}:1", GOOD, "{}"))
    pipeline.wait_for("the row behind the huge one applied", lambda: _in_view(pipeline, same))
    pipeline.wait_for("every wide row applied", lambda: all(_in_view(pipeline, e) for e in wide))
    with pipeline.db.connect() as conn:
        failed = conn.execute(
            "SELECT entity_id, failure_reason FROM outbox WHERE failed_at IS NOT NULL"
        ).fetchall()
    assert [(entity, reason.split(":")[0]) for entity, reason in failed] == [
        ("huge-headers", "too_large")
    ]
    all_up(pipeline)
