"""An outbox of the release that marked every row, with rows unsent, upgraded in place."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

import schemas
from producer import OutboxEvent, emit_many, migrate
from schemas.runtime import migrate as runner
from tests.conftest import PgSchema, TopicFactory
from tests.integration import relay_support as rs
from tests.support.docs import RELAY, example
from tests.support.kafka import drain, wait_until
from tests.support.services import Services

# The online path of outbox_relay/README.md: function, column and index made before the
# migration, one statement at a time (CREATE INDEX CONCURRENTLY runs outside a transaction).
AHEAD = [s.strip() for s in example("upgrade-online", RELAY).split(";") if s.strip()]


def _previous_release(schema: PgSchema, topic: str) -> None:
    """Migration 0001 only, 3 entities x 10 rows: seqs 1-4 published, e0's seq 5 failed."""
    [first, *_] = runner.available(migrate.OUTBOX)
    with schema.connect(autocommit=True) as conn:
        runner.apply(conn, [])  # the ledger alone
        conn.execute(first.sql.encode())
        conn.execute("INSERT INTO inorder_migrations VALUES ('outbox', 1, 'outbox')")
        conn.execute(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id,"
            " payload, published_at, publish_count, failed_at, failure_reason)"
            " SELECT %s, 'subscription', 'e' || e, s, 'subscription.plan_changed',"
            "  'old-' || e || '-' || s, %s::jsonb, CASE WHEN s <= 4 THEN now() END,"
            "  CASE WHEN s <= 4 THEN 1 ELSE 0 END,"
            "  CASE WHEN e = 0 AND s = 5 THEN now() END, CASE WHEN e = 0 AND s = 5 THEN 'x' END"
            " FROM generate_series(0, 2) e, generate_series(1, 10) s ORDER BY s, e",
            (topic, '{"plan": "pro", "price_cents": 2900, "status": "active"}'),
        )


@pytest.mark.parametrize("index_ahead", [False, True])
def test_unsent_rows_of_the_previous_release_go_first_and_once(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, index_ahead: bool
) -> None:
    """After the upgrade (index built beforehand or not) old unsent rows go once, then new ones."""
    topics = rs.RelayTopics(topic_factory("events"), topic_factory("req"), topic_factory("res"))
    _previous_release(pg_schema, topics.events)
    with pg_schema.connect(autocommit=True) as conn:
        for statement in AHEAD if index_ahead else []:
            conn.execute(statement.encode())
        applied = migrate.apply(conn)
        legacy = conn.execute("SELECT count(*) FROM outbox_resend").fetchone()
    shipped = [m.version for m in migrate.available(migrate.OUTBOX)]
    assert [m.version for m in applied] == shipped[1:]
    assert legacy == (17,)
    with pg_schema.connect() as conn, conn.transaction():
        emit_many(
            conn,
            [
                OutboxEvent(
                    "subscription",
                    f"e{e}",
                    s,
                    "subscription.plan_changed",
                    rs.PAYLOAD,
                    topic=topics.events,
                )
                for s in (11, 12)
                for e in range(3)
            ],
        )
    settings = rs.settings_for(pg_schema, services.kafka_bootstrap, topics, read_rows=4)
    with rs.running(settings):
        wait_until(lambda: rs.unsent(pg_schema) == 0)
    messages = [
        schemas.decode(m.value()) for m in drain(services.kafka_bootstrap, topics.events, expect=23)
    ]
    sent = Counter(m.event_id for m in messages)
    expected = {f"old-{e}-{s}" for e in range(3) for s in range(5, 11)} - {"old-0-5"}
    expected |= {f"subscription:e{e}:1:{s}" for e in range(3) for s in (11, 12)}
    assert sent == Counter(expected)
    for entity in ("e0", "e1", "e2"):
        seqs = [m.seq for m in messages if m.entity_id == entity]
        assert seqs == sorted(seqs)
    assert rs.count_rows(pg_schema, "id IN (SELECT id FROM outbox_resend)") == 0
    assert rs.count_rows(pg_schema, rs.SENT) == 35  # all 36 but the failed row


def test_unsent_rows_that_break_the_later_rules_are_failed_one_by_one_after_the_upgrade(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory
) -> None:
    """Rows of 0.1.0 that the rules added since refuse (an illegal topic, nested or 2 MB
    headers): after the upgrade each is failed with its reason, and the rows behind go."""
    topics = rs.RelayTopics(topic_factory("events"), topic_factory("req"), topic_factory("res"))
    [first, *_] = runner.available(migrate.OUTBOX)
    broken = {
        "illegal": ("bad topic", "{}", "bad_topic"),
        "nested": (topics.events, '{"a": {"b": "c"}}', "bad_headers"),
        "wide": (topics.events, orjson.dumps({"h": "x" * 2_000_000}).decode(), "too_large"),
    }
    with pg_schema.connect(autocommit=True) as conn:
        runner.apply(conn, [])
        conn.execute(first.sql.encode())
        conn.execute("INSERT INTO inorder_migrations VALUES ('outbox', 1, 'outbox')")
        for entity, (topic, headers, _) in [*broken.items(), ("after", (topics.events, "{}", ""))]:
            conn.execute(
                "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id,"
                " payload, headers) VALUES (%s, 'subscription', %s, 1,"
                " 'subscription.plan_changed', %s, %s, %s)",
                (topic, entity, f"old-{entity}", orjson.dumps(rs.PAYLOAD).decode(), headers),
            )
        migrate.apply(conn)
    with rs.running(rs.settings_for(pg_schema, services.kafka_bootstrap, topics)):
        wait_until(lambda: rs.count_rows(pg_schema, rs.SENT) == 1)
        wait_until(lambda: rs.count_rows(pg_schema, "failed_at IS NOT NULL") == 3)
    with pg_schema.connect() as conn:
        failed = dict(
            conn.execute(
                "SELECT entity_id, split_part(failure_reason, ':', 1) FROM outbox "
                "WHERE failed_at IS NOT NULL"
            ).fetchall()
        )
    assert failed == {entity: reason for entity, (_, _, reason) in broken.items()}
    [sent] = drain(services.kafka_bootstrap, topics.events, expect=1)
    assert schemas.decode(sent.value()).entity_id == "after"
