"""Snapshots through the outbox, the relay and the consumer: projections rebuilt, steps moved on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import redis

from producer import migrate
from producer.subscriptions import change_plan, create_subscription
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import relay_support as rs
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.kafka import wait_until
from tests.support.services import ROOT, Services

SUBSCRIPTION_STATE = (
    "jsonb_build_object('plan', t.plan, 'price_cents', t.price_cents, "
    "'status', CASE WHEN t.deleted THEN 'deleted' ELSE 'active' END)"
)
SUBSCRIPTIONS = ("subscription", "--table", "subscriptions", "--payload", SUBSCRIPTION_STATE)


def _snapshot(schema: PgSchema, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``inorder-producer snapshot`` against the test's schema and topic."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    return subprocess.run(
        [sys.executable, "-m", "producer", "snapshot", *args, "--no-progress"],
        env={**base, "DATABASE_URL": schema.url, "INORDER_EVENTS_TOPIC": topic},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )


def _admin(schema: PgSchema, consumer: object, *args: str) -> subprocess.CompletedProcess[str]:
    return sw.run_tool("inorder-admin", cs.consumer_env(consumer), *args)  # type: ignore[arg-type]


def _example_tables(schema: PgSchema) -> None:
    with schema.connect(autocommit=True) as conn:
        migrate.apply(conn, (migrate.OUTBOX, migrate.EXAMPLE))


def test_a_projection_whose_newest_events_were_purged_is_rebuilt_by_a_snapshot(
    outbox: PgSchema,
    services: Services,
    topics: rs.RelayTopics,
    topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    """The plan change's row is gone before it was sent: a snapshot brings the view to it."""
    _example_tables(outbox)
    cs.create_view(outbox)
    routes = tmp_path / "routes.toml"
    routes.write_text(cs.ROUTES)
    relay = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    # The seat ledgers the example writes beside are not routed here: dead-lettered.
    consumer = cs.settings_for(
        outbox, services.kafka_bootstrap, routes, topics.events, topic_factory("dlq")
    )
    with outbox.connect() as conn:
        create_subscription(conn, "s1", "basic", topic=topics.events)
        create_subscription(conn, "s2", "free", topic=topics.events)
    with rs.running(relay), cs.running(consumer):
        wait_until(lambda: set(cs.view(outbox)) == {"s1", "s2"}, timeout_s=60)
    with outbox.connect() as conn:  # written, then lost before the relay sent it
        change_plan(conn, "s1", "pro", topic=topics.events)
        change_plan(conn, "s1", "enterprise", topic=topics.events)
        conn.execute("DELETE FROM outbox WHERE entity_id = 's1' AND seq > 1")
        conn.commit()
    taken = _snapshot(
        outbox,
        topics.events,
        *SUBSCRIPTIONS,
    )
    assert taken.returncode == 0, taken.stderr
    assert "2 snapshots written, 0 already there" in taken.stderr
    with rs.running(relay), cs.running(consumer):
        wait_until(lambda: cs.view(outbox)["s1"][:3] == (1, 3, "enterprise"), timeout_s=60)
        wait_until(lambda: cs.view(outbox)["s2"][:2] == (1, 1), timeout_s=60)
    assert cs.view(outbox)["s1"] == (1, 3, "enterprise", 9900, "active")
    again = _snapshot(
        outbox,
        topics.events,
        *SUBSCRIPTIONS,
    )
    assert "0 snapshots written, 2 already there at their version, of 2" in again.stderr
    told = orjson.loads(_admin(outbox, consumer, "--json", "explain", "subscription:s1").stdout)
    assert told["verdict"] == "consistent with the outbox (healed by snapshot at 1/3)"
    audited = _admin(outbox, consumer, "--json", "audit")
    assert audited.returncode == 0, audited.stdout + audited.stderr
    summary = orjson.loads(audited.stdout.splitlines()[-1])
    assert (summary["unexplained"], summary["healed_by_snapshot"]) == (0, 1)


def test_a_new_projection_is_bootstrapped_from_a_snapshot_of_10000_entities(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """10,000 subscriptions with no event left: one snapshot fills the new view, audit clean."""
    _example_tables(outbox)
    cs.create_view(outbox)
    with outbox.connect() as conn:
        conn.execute(
            "INSERT INTO subscriptions (id, generation, version, deleted, plan, price_cents) "
            "SELECT 'b-' || n, 1 + n % 2, 1 + n % 7, n % 50 = 0, "
            "(ARRAY['free', 'basic', 'pro', 'enterprise'])[1 + n % 4], (n % 4) * 900 "
            "FROM generate_series(1, 10000) AS n"
        )
        conn.commit()
    taken = _snapshot(
        outbox,
        topics.events,
        *SUBSCRIPTIONS,
        "--rate",
        "50000",
    )
    assert taken.returncode == 0, taken.stderr
    assert "10000 snapshots written, 0 already there at their version, of 10000" in taken.stderr
    routes = tmp_path / "routes.toml"
    routes.write_text(cs.ROUTES)
    relay = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    consumer = cs.settings_for(
        outbox, services.kafka_bootstrap, routes, topics.events, f"{topics.events}.dlq"
    )
    with rs.running(relay), cs.running(consumer):
        wait_until(lambda: len(cs.view(outbox)) == 10_000, timeout_s=240, interval_s=1.0)
    view = cs.view(outbox)
    assert view["b-7"] == (2, 1, "enterprise", 2700, "active")
    assert view["b-50"][4] == "deleted"
    audited = _admin(outbox, consumer, "--json", "audit")
    assert audited.returncode == 0, audited.stdout + audited.stderr
    summary = orjson.loads(audited.stdout.splitlines()[-1])
    assert (summary["divergences"], summary["healed_by_snapshot"]) == (0, 10_000)


LEDGERS = """
CREATE TABLE ledgers (
    id text PRIMARY KEY, generation bigint NOT NULL, version bigint NOT NULL,
    deleted boolean NOT NULL DEFAULT false, amount integer NOT NULL
)
"""


def test_a_step_route_with_baseline_moves_on_to_a_snapshot_and_drains_what_waited(
    outbox: PgSchema,
    services: Services,
    topics: rs.RelayTopics,
    tmp_path: Path,
    redis_prefix: str,
    redis_client: redis.Redis,
) -> None:
    """Seqs 3..5 lost, 6 parked: the snapshot at 5 moves the entity on; 6 applies after it."""
    ss.prepare(outbox)
    with outbox.connect() as conn:
        conn.execute(LEDGERS)
        conn.execute("INSERT INTO ledgers VALUES ('a', 1, 5, false, 50)")
        conn.commit()
    p = sw.Pipeline(outbox, services, topics, None)  # type: ignore[arg-type]
    sw.write_outbox(p, range(1, 7))
    with outbox.connect() as conn:
        conn.execute("DELETE FROM outbox WHERE entity_id = 'a' AND seq BETWEEN 3 AND 5")
        conn.commit()
    routes = tmp_path / "routes.toml"
    routes.write_text(
        ss.routes_text(extra="").replace('kind = "step"', 'kind = "step"\nbaseline = true')
    )
    relay = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    consumer = cs.parking_settings_for(
        outbox, services, routes, topics.events, f"{topics.events}.dlq", redis_prefix
    )
    with rs.running(relay), cs.running(consumer):
        wait_until(lambda: ss.progress(outbox) is not None and ss.progress(outbox)[1] == 2)
        wait_until(lambda: redis_client.keys(f"{redis_prefix}*"), timeout_s=30)  # 6 parked
        taken = _snapshot(outbox, topics.events, "ledger", "--table", "ledgers")
        assert taken.returncode == 0, taken.stderr
        wait_until(lambda: (ss.progress(outbox) or (0, 0))[1] == 6, timeout_s=60)
    assert ss.applied(outbox) == [(1, 1), (1, 2), (1, 6)]
    with outbox.connect() as conn:
        logged = conn.execute(
            "SELECT seq, event_type FROM inorder_step_log WHERE entity_id = 'a' ORDER BY seq"
        ).fetchall()
    assert logged == [
        (1, "ledger.added"),
        (2, "ledger.added"),
        (5, "ledger.snapshot"),
        (6, "ledger.added"),
    ]
    audited = _admin(outbox, consumer, "--json", "audit")
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert '"healed_by_snapshot":1' in audited.stdout


def test_a_snapshot_takes_only_what_where_keeps_and_refuses_a_bad_table_in_one_line(
    outbox: PgSchema, topics: rs.RelayTopics
) -> None:
    """--where filters the rows; a table that is not there is one line naming it, exit 2."""
    _example_tables(outbox)
    with outbox.connect() as conn:
        create_subscription(conn, "w1", "pro", topic=topics.events)
        create_subscription(conn, "w2", "free", topic=topics.events)
    taken = _snapshot(outbox, topics.events, *SUBSCRIPTIONS, "--where", "t.plan = 'pro'")
    assert "1 snapshots written, 0 already there at their version, of 1" in taken.stderr
    with outbox.connect() as conn:
        rows = conn.execute(
            "SELECT entity_id, seq, event_type, payload FROM outbox "
            "WHERE event_type = 'subscription.snapshot'"
        ).fetchall()
    assert rows == [
        ("w1", 1, "subscription.snapshot", {"plan": "pro", "price_cents": 2900, "status": "active"})
    ]
    bad = _snapshot(outbox, topics.events, "subscription", "--table", "nowhere")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        'inorder-producer: snapshot refused: relation "nowhere" does not exist'
    )


def test_a_gap_the_outbox_cannot_fill_is_healed_by_a_snapshot_the_sweeper_asks_for(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Seq 3 purged: unrecoverable, a snapshot asked; --requested answers; held no more."""
    routes = ss.routes_text().replace(
        'kind = "step"', 'kind = "step"\nbaseline = true\nsnapshot_when_unrecoverable = true'
    )
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix, routes_text=routes)
    with pg_schema.connect() as conn:
        conn.execute(LEDGERS)
        conn.execute("INSERT INTO ledgers VALUES ('a', 1, 3, false, 30)")
        conn.commit()
    sw.write_outbox(p, range(1, 7))
    with pg_schema.connect() as conn:
        conn.execute("DELETE FROM outbox WHERE seq = 3")
        conn.commit()
    with sw.running(p):
        wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["unrecoverable"], timeout_s=60)
        [(_, _, _, _, _, reason)] = sw.gap_rows(p)
        assert reason.endswith("; a snapshot was requested")
        with pg_schema.connect() as conn:
            asked = conn.execute(
                "SELECT entity_type, entity_id, requested_by, taken_at IS NULL "
                "FROM outbox_snapshot_requests"
            ).fetchall()
        assert asked == [("ledger", "a", "sweeper", True)]
        taken = _snapshot(pg_schema, p.topics.events, "ledger", "--table", "ledgers", "--requested")
        assert taken.returncode == 0, taken.stderr
        assert "1 snapshots written" in taken.stderr
        wait_until(lambda: (ss.progress(pg_schema) or (0, 0))[1] == 6, timeout_s=60)
        wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["healed"], timeout_s=30)
    assert ss.applied(pg_schema) == [(1, 1), (1, 2), (1, 4), (1, 5), (1, 6)]
    [(status, _, _, _, by, reason)] = sw.gap_rows(p)
    assert (status, by, reason) == ("healed", "snapshot", "moved past by the snapshot at seq 3")
    assert ss.progress(pg_schema)[2] is False  # no longer held
    with pg_schema.connect() as conn:
        still = conn.execute(
            "SELECT count(*) FROM outbox_snapshot_requests WHERE taken_at IS NULL"
        ).fetchone()
    assert still == (0,)


def test_following_asks_takes_each_as_it_comes_and_stops_on_sigterm(
    outbox: PgSchema, topics: rs.RelayTopics
) -> None:
    """--requested --follow answers an ask written while it runs; --follow alone is refused."""
    with outbox.connect() as conn:
        conn.execute(LEDGERS)
        conn.execute("INSERT INTO ledgers VALUES ('f', 2, 4, false, 7)")
        conn.commit()
    alone = _snapshot(outbox, topics.events, "ledger", "--table", "ledgers", "--follow", "1")
    assert alone.returncode == 2
    assert "--follow needs --requested" in alone.stderr
    base = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "producer",
            "snapshot",
            "ledger",
            "--table",
            "ledgers",
            "--requested",
            "--follow",
            "0.2",
        ],
        env={**base, "DATABASE_URL": outbox.url, "INORDER_EVENTS_TOPIC": topics.events},
        cwd=ROOT,
    )
    try:
        with outbox.connect() as conn:
            conn.execute(
                "INSERT INTO outbox_snapshot_requests (entity_type, entity_id, reason, "
                "requested_by) VALUES ('ledger', 'f', 'test', 'sweeper')"
            )
            conn.commit()

        def snapshotted() -> object:
            with outbox.connect() as conn:
                return conn.execute(
                    "SELECT generation, seq FROM outbox WHERE event_type = 'ledger.snapshot'"
                ).fetchone()

        assert wait_until(snapshotted, timeout_s=30) == (2, 4)
    finally:
        follower.terminate()
        assert follower.wait(30) == 0
