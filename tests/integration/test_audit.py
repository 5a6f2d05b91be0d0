"""inorder-admin audit: the outbox against the consumer's projections and step log."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.kafka import wait_until
from tests.support.services import Services


@pytest.fixture
def settled(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> sw.Pipeline:
    """Subscriptions projected and ledger steps applied through the real relay and consumer."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    cs.create_view(pg_schema)
    p.settings.routes_file.write_text(ss.routes_text() + cs.ROUTES)
    sw.write_outbox(p, range(1, 8), "a")
    sw.write_outbox(p, range(1, 4), "b")
    with pg_schema.connect() as conn:
        for sub, seq, plan in (("s1", 1, "free"), ("s1", 2, "pro"), ("s2", 1, "basic")):
            conn.execute(
                "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
                "payload) VALUES (%s, 'subscription', %s, %s, 'subscription.plan_changed', %s, %s)",
                (
                    p.topics.events,
                    sub,
                    seq,
                    f"{sub}:{seq}",
                    f'{{"plan": "{plan}", "price_cents": {seq}, "status": "active"}}',
                ),
            )
        conn.commit()
    with sw.running(p, sweeper=False):
        wait_until(lambda: (ss.progress(pg_schema, "a") or (0, 0))[1] == 7, timeout_s=60)
        wait_until(lambda: (ss.progress(pg_schema, "b") or (0, 0))[1] == 3)
        wait_until(
            lambda: cs.view(pg_schema).get("s1", (0, 0))[1] == 2 and "s2" in cs.view(pg_schema)
        )
    return p


def test_settled_pipeline_audits_clean(settled: sw.Pipeline) -> None:
    """After everything applied, the audit finds no divergence and exits 0."""
    done = sw.admin(settled, "--json", "audit")
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"divergences":0' in done.stdout
    assert '"entities":4' in done.stdout


def test_corrupted_projection_row_is_named(settled: sw.Pipeline, pg_schema: PgSchema) -> None:
    """A projection row changed behind the consumer's back is reported, unexplained, exit 1."""
    with pg_schema.connect() as conn:
        conn.execute("UPDATE billing_view SET plan = 'enterprise' WHERE subscription_id = 's1'")
        conn.commit()
    done = sw.admin(settled, "--json", "audit")
    assert done.returncode == 1
    assert '"entity_id":"s1"' in done.stdout
    assert "column plan is 'enterprise', event says 'pro'" in done.stdout
    assert done.stderr.strip() == "inorder-admin: 1 unexplained divergence(s); see the table above"


def test_steps_waiting_behind_an_unrecoverable_gap_are_explained(
    settled: sw.Pipeline, pg_schema: PgSchema
) -> None:
    """Steps parked behind a gap the relay cannot fill count as explained by that gap."""
    sw.write_outbox(settled, range(9, 11), "a")  # seq 8 never written: a gap before 9
    with sw.running(settled):
        wait_until(lambda: [g[0] for g in sw.gap_rows(settled)] == ["unrecoverable"], timeout_s=60)
    done = sw.admin(settled, "--json", "audit")
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"cause":"gap unrecoverable 8..8"' in done.stdout
    assert '"unexplained":0' in done.stdout


def test_dead_lettered_event_is_explained(settled: sw.Pipeline, pg_schema: PgSchema) -> None:
    """An event the projection table refused is dead-lettered, and the audit names that cause."""
    with pg_schema.connect() as conn:
        conn.execute(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
            "payload) "
            "VALUES (%s, 'subscription', 's3', 1, 'subscription.imported', 's3:1', "
            '\'{"plan": "pro", "price_cents": "lots", "status": "active"}\')',
            (settled.topics.events,),
        )
        conn.commit()
    with sw.running(settled, sweeper=False):
        wait_until(lambda: _dead_letters(pg_schema) == 1, timeout_s=30)
    done = sw.admin(settled, "--json", "audit")
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"cause":"dead-lettered: projection_rejected"' in done.stdout


def _dead_letters(db: PgSchema) -> int:
    with db.connect() as conn:
        row = conn.execute("SELECT count(*) FROM inorder_dead_letters").fetchone()
    return int(row[0]) if row else 0
