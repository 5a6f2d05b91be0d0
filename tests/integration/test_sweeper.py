"""The sweeper with the real relay, consumer and services: lost events repaired, or handed over."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

from tests.conftest import PgSchema, TopicFactory
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.kafka import wait_until
from tests.support.services import Services


def _escalations() -> float:
    return (
        REGISTRY.get_sample_value("event_gaps_escalated_total", {"event_type": "ledger.added"})
        or 0.0
    )


def test_lost_event_is_detected_republished_and_healed(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path,
    redis_prefix: str,
) -> None:  # fmt: skip
    """A row marked published but never sent: later events park, the gap heals by itself."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    sw.write_outbox(p, range(1, 6))
    with pg_schema.connect() as conn:  # the lost event: marked as sent, never sent
        conn.execute("UPDATE outbox SET published_at = now(), publish_count = 1 WHERE seq = 3")
        conn.commit()
    before = _escalations()
    with sw.running(p):
        wait_until(lambda: (ss.progress(pg_schema) or (0, 0))[1] == 5, timeout_s=60)
        wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["healed"], timeout_s=30)
    [(status, first, last, attempts, by, _)] = sw.gap_rows(p)
    assert (status, first, last, by) == ("healed", 3, 3, "sweeper")
    assert attempts >= 1
    assert _escalations() - before == 1
    assert ss.applied(pg_schema) == [(1, s) for s in range(1, 6)]
