"""emit() and the outbox table against a real PostgreSQL."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from producer import (
    DuplicateEventError,
    InvalidEventError,
    NotInTransactionError,
    OutboxEvent,
    emit,
    emit_many,
    migrate,
)
from tests.conftest import PgSchema

PAYLOAD = {"plan": "pro", "price_cents": 2900, "status": "active"}


def _event(seq: int = 1, **changes: Any) -> OutboxEvent:
    fields: dict[str, Any] = {
        "entity_type": "subscription",
        "entity_id": "s1",
        "seq": seq,
        "event_type": "subscription.plan_changed",
        "payload": PAYLOAD,
    }
    return OutboxEvent(**{**fields, **changes})


def _rows(schema: PgSchema) -> list[tuple[Any, ...]]:
    with schema.connect() as conn:
        return conn.execute(
            "SELECT entity_type, entity_id, generation, seq, event_type, event_id, payload, "
            "headers, xid::text FROM outbox ORDER BY id"
        ).fetchall()


def test_emit_writes_the_row_in_the_callers_transaction(outbox: PgSchema) -> None:
    """emit inserts one row with every column, stamped with the transaction's id, on commit."""
    with outbox.connect() as conn:
        with conn.transaction():
            emit(conn, _event(headers={"trace": "t1"}))
            assert _rows(outbox) == []
            xid = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert _rows(outbox) == [
            (
                "subscription",
                "s1",
                1,
                1,
                "subscription.plan_changed",
                "subscription:s1:1:1",
                PAYLOAD,
                {"trace": "t1"},
                xid[0] if xid else None,
            ),
        ]


def test_emit_never_commits_on_its_own(outbox: PgSchema) -> None:
    """When the caller rolls back, the emitted row is gone with the state change."""
    with outbox.connect() as conn:
        conn.execute("SELECT 1")
        emit(conn, _event())
        conn.rollback()
    assert _rows(outbox) == []


def test_emit_refuses_without_a_transaction(outbox: PgSchema) -> None:
    """emit on an autocommit or idle connection raises NotInTransactionError and writes nothing."""
    with outbox.connect(autocommit=True) as conn, pytest.raises(NotInTransactionError):
        emit(conn, _event())
    with outbox.connect() as conn, pytest.raises(NotInTransactionError):
        emit(conn, _event())
    assert _rows(outbox) == []


def _emit_in_pipeline(conn: Any, *, begin: bool) -> None:
    with conn.pipeline():
        if begin:
            conn.execute("BEGIN")
            conn.execute("SELECT 1").fetchall()  # libpq still reads the state as idle here
        emit(conn, _event())
        if begin:
            conn.execute("COMMIT")


def test_emit_in_pipeline_mode_knows_whether_a_transaction_is_open(outbox: PgSchema) -> None:
    """In a pipeline, emit refuses outside a transaction and writes inside one begun unsynced."""
    with outbox.connect(autocommit=True) as conn:
        with pytest.raises(NotInTransactionError):
            _emit_in_pipeline(conn, begin=False)
        _emit_in_pipeline(conn, begin=True)
    assert len(_rows(outbox)) == 1


def test_duplicate_entity_version_is_a_named_error(outbox: PgSchema) -> None:
    """A second event with the same (entity, generation, seq) raises DuplicateEventError."""
    with outbox.connect() as conn:
        with conn.transaction():
            emit(conn, _event(seq=3))
        with pytest.raises(DuplicateEventError) as caught, conn.transaction():
            emit(conn, _event(seq=3, event_id="another-id"))
    assert caught.value.constraint == "outbox_entity_seq_key"
    assert "(subscription, s1, 1, 3, f)" in caught.value.detail


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"payload": {"plan": "gold", "price_cents": 1, "status": "active"}}, "plan"),
        ({"payload": {"plan": "pro", "price_cents": -5, "status": "active"}}, "price_cents"),
        ({"payload": {"plan": "pro"}}, "required"),
        ({"event_type": "subscription.renamed"}, "no payload schema"),
        ({"entity_type": "bad:type"}, "entity_type"),
        ({"entity_id": ""}, "entity_id"),
        ({"seq": 0}, "seq"),
        ({"generation": True}, "generation"),
    ],
)
def test_emit_rejects_events_that_break_the_contract(
    outbox: PgSchema, changes: dict[str, Any], message: str
) -> None:
    """An event whose envelope or payload breaks its schema raises InvalidEventError naming why."""
    with outbox.connect() as conn, conn.transaction():
        conn.execute("SELECT 1")
        with pytest.raises(InvalidEventError, match=message):
            emit(conn, _event(**changes))
    assert _rows(outbox) == []


def test_emit_many_writes_all_events_in_one_call(outbox: PgSchema) -> None:
    """emit_many writes every event it is given, in order."""
    with outbox.connect() as conn, conn.transaction():
        emit_many(conn, [_event(seq=s) for s in range(1, 51)])
    assert [row[3] for row in _rows(outbox)] == list(range(1, 51))


def test_emit_many_keeps_the_order_it_was_given_across_entities(outbox: PgSchema) -> None:
    """One statement for the batch: rows take ids in the order of the list, whatever entity."""
    events = [
        _event(seq=seq, entity_id=f"s{entity}", event_id=f"e-{entity}-{seq}")
        for seq in (3, 1, 2)
        for entity in (2, 9, 1)
    ]
    with outbox.connect() as conn, conn.transaction():
        emit_many(conn, events[:1])
        emit_many(conn, events[1:])
    assert [(r[1], r[3]) for r in _rows(outbox)] == [(e.entity_id, e.seq) for e in events]


def test_emit_many_refuses_the_whole_batch_on_one_row_the_table_refuses(
    outbox: PgSchema,
) -> None:
    """A topic Kafka refuses in the middle of a batch: the table's rule is named, nothing lands."""
    events = [_event(seq=1), _event(seq=2, topic="bad topic"), _event(seq=3)]
    with outbox.connect() as conn:
        with pytest.raises(psycopg.errors.CheckViolation) as refused, conn.transaction():
            emit_many(conn, events)
        with conn.transaction():
            emit(conn, _event(seq=5))
            with pytest.raises(DuplicateEventError) as duplicate:
                emit_many(conn, [_event(seq=4), _event(seq=5, event_id="other")])
    assert refused.value.diag.constraint_name == "outbox_topic_legal"
    assert duplicate.value.constraint == "outbox_entity_seq_key"
    assert _rows(outbox) == []


def test_insert_notifies_listeners_on_commit(outbox: PgSchema) -> None:
    """A committed insert sends one NOTIFY on inorder_outbox naming the schema."""
    with outbox.connect(autocommit=True) as listener:
        listener.execute("LISTEN inorder_outbox")
        with outbox.connect() as conn, conn.transaction():
            emit_many(conn, [_event(seq=s) for s in (1, 2, 3)])
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [(n.channel, n.payload) for n in notes] == [("inorder_outbox", outbox.name)]


def test_migrations_are_idempotent_and_safe_concurrently(pg_schema: PgSchema) -> None:
    """Migrating from four threads at once applies each file exactly once."""
    applied: list[int] = []

    def run() -> None:
        with pg_schema.connect(autocommit=True) as conn:
            applied.append(len(migrate.apply(conn, (migrate.OUTBOX, migrate.EXAMPLE))))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = len(migrate.available(migrate.OUTBOX)) + len(migrate.available(migrate.EXAMPLE))
    assert sorted(applied) == [0, 0, 0, total]
    with pg_schema.connect() as conn:
        count = conn.execute("SELECT count(*) FROM inorder_migrations").fetchone()
    assert count == (total,)


def test_outbox_rejects_rows_that_break_the_envelope(outbox: PgSchema) -> None:
    """Plain SQL cannot insert a row the codec would reject: CHECK constraints hold the contract."""
    insert = (
        "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload) "
        "VALUES ('t', %s, %s, %s, %s, %s, %s)"
    )
    bad = [
        ("a:b", "s1", 1, "x.y", "e1", "{}"),
        ("sub", "", 1, "x.y", "e2", "{}"),
        ("sub", "s1", 0, "x.y", "e3", "{}"),
        ("sub", "s1", 1, "Bad Type", "e4", "{}"),
        ("sub", "s1", 1, "x.y", "e5", "[1]"),
    ]
    for values in bad:
        with outbox.connect() as conn, pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(insert, values)


def nested_dict(levels: int) -> Any:
    """``levels`` nested objects."""
    value: Any = 0
    for _ in range(levels):
        value = {"d": value}
    return value


def test_writers_cannot_set_the_columns_only_inorder_writes(outbox: PgSchema) -> None:
    """xid, id, created_at and the failure marks a writer sends are replaced, by INSERT and by
    COPY alike."""
    with outbox.connect() as conn:
        conn.execute(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload,"
            " id, xid, failed_at, failure_reason, created_at) VALUES ('t', 'sub', 's1', 1, 'x.y',"
            " 'e1', '{}', 9000000000, '99999999999', now(), 'x', '2999-01-01')"
        )
        with conn.cursor().copy(
            "COPY outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload,"
            " id, xid, created_at) FROM STDIN"
        ) as copy:
            copy.write_row(
                ("t", "sub", "s1", 2, "x.y", "e2", "{}", 9000000001, "99999999999", "1999-01-01")
            )
        own = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        rows = conn.execute(
            "SELECT id, xid::text, failed_at, failure_reason, created_at = now() FROM outbox"
            " ORDER BY seq"
        ).fetchall()
    assert own is not None
    assert [r[1] for r in rows] == [own[0], own[0]]  # the writing transaction's own id
    assert all(r[0] < 9000000000 for r in rows)
    assert rows[0][0] < rows[1][0]  # ids still follow the write order
    assert [(r[2], r[3]) for r in rows] == [(None, None), (None, None)]
    assert [r[4] for r in rows] == [True, True]  # the writing transaction's time


def test_rows_written_with_a_time_ahead_before_the_stamp_are_brought_back_to_now(
    outbox: PgSchema,
) -> None:
    """Migration 0007 moves a created_at in the future (which held back retention) to now."""
    with outbox.connect() as conn:
        conn.execute("ALTER TABLE outbox DISABLE TRIGGER outbox_stamp")
        conn.execute(
            "INSERT INTO outbox (id, topic, entity_type, entity_id, seq, event_type, event_id,"
            " payload, created_at) VALUES (1, 't', 'sub', 's1', 1, 'x.y', 'e1', '{}',"
            " '2999-01-01'), (2, 't', 'sub', 's1', 2, 'x.y', 'e2', '{}', '2020-01-01')"
        )
        conn.execute("ALTER TABLE outbox ENABLE ALWAYS TRIGGER outbox_stamp")
        [stamp] = [m for m in migrate.available(migrate.OUTBOX) if m.version == 7]
        conn.execute(stamp.sql.encode())
        rows = conn.execute(
            "SELECT created_at <= now(), created_at < '2021-01-01' FROM outbox ORDER BY seq"
        ).fetchall()
    assert rows == [(True, False), (True, True)]  # a time past is left as it was


def test_the_stamp_holds_where_a_restore_turns_triggers_off(outbox: PgSchema) -> None:
    """With session_replication_role = replica (pg_restore, logical replicas) xid is stamped."""
    with outbox.connect() as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload,"
            " xid) VALUES "
            "('t', 'sub', 's1', 1, 'x.y', 'e1', '{}', '99999999999')"
        )
        row = conn.execute(
            "SELECT xid = pg_current_xact_id() FROM outbox WHERE event_id = 'e1'"
        ).fetchone()
    assert row == (True,)


@pytest.mark.parametrize(
    ("topic", "headers"),
    [
        ("bad topic", "{}"),
        ("", "{}"),
        ("..", "{}"),
        ("x" * 250, "{}"),
        ("t", '{"n": 5}'),
        ("t", '{"nested": {"a": "b"}}'),
        ("t", '{"list": ["a"]}'),
    ],
)
def test_outbox_refuses_topics_kafka_refuses_and_headers_that_are_not_strings(
    outbox: PgSchema, topic: str, headers: str
) -> None:
    """A row whose topic Kafka would refuse, or whose headers are not strings, is never written."""
    with outbox.connect() as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload,"
            " headers) VALUES "
            "(%s, 'sub', 's1', 1, 'x.y', 'e1', '{}', %s)",
            (topic, headers),
        )


@pytest.mark.parametrize(
    ("changes", "word"),
    [
        ({"entity_id": "a\x00b"}, "NUL"),
        ({"event_id": "e\x00"}, "NUL"),
        ({"payload": {"plan": "pro\x00", "price_cents": 1, "status": "active"}}, "NUL"),
        ({"headers": {"trace\x00": "x"}}, "NUL"),
        ({"headers": {"trace": 5}}, "strings"),
        ({"headers": {"big": "x" * 40_000}}, "characters"),
        ({"headers": {f"h{i}": "x" * 1000 for i in range(40)}}, "characters"),
        ({"event_type": "x.y", "payload": {"d": nested_dict(200)}}, "deeper"),
        ({"event_type": "x.y", "payload": {"ratio": float("nan")}}, "JSON cannot hold"),
        ({"event_type": "x.y", "payload": {"a": [float("-inf")]}}, "JSON cannot hold"),
        ({"event_type": "x.y", "payload": {"a": {1: "x"}}}, "not a string: int"),
    ],
)
def test_emit_refuses_what_no_store_holds(
    outbox: PgSchema, changes: dict[str, Any], word: str
) -> None:
    """emit names the problem before PostgreSQL or a consumer would meet it."""
    event = OutboxEvent(
        **{  # type: ignore[arg-type]
            "entity_type": "subscription",
            "entity_id": "s1",
            "seq": 1,
            "event_type": "subscription.plan_changed",
            "payload": {"plan": "pro", "price_cents": 1, "status": "active"},
            **changes,
        }
    )
    with outbox.connect() as conn, conn.transaction(), pytest.raises(InvalidEventError) as refused:
        emit(conn, event)
    assert word in str(refused.value)
    with outbox.connect() as conn, conn.transaction(), pytest.raises(InvalidEventError) as refused:
        emit_many(conn, [_event(seq=1), replace(event, seq=2)])
    assert word in str(refused.value)
    assert _rows(outbox) == []


@pytest.mark.parametrize(
    ("headers", "payload"),
    [
        ("jsonb_build_object('big', repeat('x', 70000))", "'{}'"),
        ("'{}'", "jsonb_build_object('big', repeat('x', 17000000))"),
    ],
)
def test_outbox_refuses_a_row_larger_than_any_message_where_it_is_written(
    outbox: PgSchema, headers: str, payload: str
) -> None:
    """Headers over 64 KiB, or a payload over 16 MiB, written by SQL: a CHECK refuses the row."""
    with outbox.connect() as conn, pytest.raises(psycopg.errors.CheckViolation) as refused:
        conn.execute(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
            f"headers, payload) SELECT 't', 'sub', 's1', 1, 'x.y', 'e1', {headers}, {payload}"
        )
    assert "size" in (refused.value.diag.constraint_name or "")
