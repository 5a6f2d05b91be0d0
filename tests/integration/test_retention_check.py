"""The sweeper's check of the relays' retention, against a relay that says its own."""

from __future__ import annotations

from pathlib import Path

import redis
from structlog.testing import capture_logs

from consumer.kinds.steps.retention import RetentionWatch
from outbox_relay.settings import RelaySettings
from tests.conftest import PgSchema, TopicFactory
from tests.integration import relay_support as rs
from tests.integration import sweeper_support as sw
from tests.support.kafka import wait_until
from tests.support.services import Services


def _said(pg: PgSchema) -> list[float]:
    with pg.connect() as conn:
        return [row[0] for row in conn.execute("SELECT retention_s FROM outbox_relays")]


def test_a_relay_keeping_rows_less_than_a_park_may_wait_is_named_once_until_mended(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    """A live relay's retention under park TTL plus repair: one error line, then quiet,
    then one line when a relay with a long enough retention replaces it."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    repair = p.settings.worst_case_repair_s()
    parks = {"ledger": 3600}
    repairs = {k: v for k, v in sw.FAST_REPAIR.items() if k in RelaySettings.model_fields}
    short = rs.settings_for(
        p.db, services.kafka_bootstrap, p.topics, retention_s=repair + 60, **repairs
    )
    with pg_schema.connect(autocommit=True) as conn:
        watch = RetentionWatch(conn, None)
        assert watch.check(parks, repair) is None  # no relay has said yet
        with capture_logs() as logged, rs.running(short):
            wait_until(lambda: _said(pg_schema) == [repair + 60], timeout_s=30)
            first = watch.check(parks, repair)
            again = watch.check(parks, repair)
        assert first is not None
        assert first == again
        assert "route ledger's park_ttl_s (3600 s)" in first
        assert [e["event"] for e in logged].count("retention_shorter_than_parks") == 1
        long = rs.settings_for(
            p.db, services.kafka_bootstrap, p.topics, retention_s=7200, **repairs
        )
        conn.execute("DELETE FROM outbox_relays")  # the short relay is gone
        with capture_logs() as logged, rs.running(long):
            wait_until(lambda: _said(pg_schema) == [7200.0], timeout_s=30)
            assert watch.check(parks, repair) is None
        assert "retention_outlives_parks" in [e["event"] for e in logged]
