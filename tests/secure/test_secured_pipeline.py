"""Every program on the secured stack with its own least-privilege credentials, end to end.

TLS on every connection; a PostgreSQL role, a Redis ACL user and a Kafka SCRAM principal
per program; Kafka ACLs from ``schemas.security``; the owner migrates and grants.
"""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import ConfigResource

from tests.secure.pipeline import ENTITIES, LOST, SEQS, Run, owner_prepares, produce
from tests.support.kafka import wait_until

pytestmark = [pytest.mark.secure, pytest.mark.timeout(600)]


def test_every_program_runs_end_to_end_with_its_own_least_privilege_credentials(
    run: Run,
) -> None:
    """Relay, two consumers, sweeper and admin over TLS as themselves: a lost event heals."""
    owner_prepares(run)
    produce(run)
    with run.secured.owner() as conn:  # one event lost: behind every relay's cursor
        conn.execute(f"SET search_path = {run.secured.schema}")
        conn.execute("UPDATE outbox SET xid = '0' WHERE entity_id = %s AND seq = %s", LOST)
    run.start("relay", "inorder-relay", "relay")
    run.start("consumer-1", "inorder-consumer", "consumer")
    run.start("consumer-2", "inorder-consumer", "consumer")
    run.start("sweeper", "inorder-sweeper", "sweeper")

    def applied() -> int:
        with run.secured.owner() as conn:
            conn.execute(f"SET search_path = {run.secured.schema}")
            row = conn.execute("SELECT count(*) FROM applied_steps").fetchone()
            return int(row[0]) if row else 0

    wait_until(lambda: applied() == ENTITIES * SEQS, timeout_s=180, interval_s=1)
    audit = run.run("admin", "inorder-admin", "--json", "audit")
    assert audit.returncode == 0, audit.stderr
    lines = [json.loads(line) for line in audit.stdout.splitlines() if line.startswith("{")]
    summary = next(line for line in reversed(lines) if "unexplained" in line)
    assert summary["unexplained"] == 0, summary
    _every_connection_is_encrypted(run)
    codes = run.stop()
    assert all(code == 0 for code in codes.values()), codes
    with run.secured.owner() as conn:
        conn.execute(f"SET search_path = {run.secured.schema}")
        gaps = conn.execute("SELECT status FROM inorder_gaps").fetchall()
    assert gaps == [("healed",)]


def _every_connection_is_encrypted(run: Run) -> None:
    """Seen from each server: PostgreSQL's sessions all on TLS, Redis's clients all on its
    TLS port (its plain port is closed), Kafka's only client listener SASL_SSL."""
    with run.secured.superuser() as conn:
        sessions = conn.execute(
            "SELECT a.usename, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.usename LIKE 'inorder_%'"
        ).fetchall()
    assert {user for user, _ in sessions} >= {
        "inorder_relay",
        "inorder_consumer",
        "inorder_sweeper",
    }
    assert all(ssl for _, ssl in sessions), sessions
    admin = run.secured.redis_admin()
    try:
        clients = admin.client_list()
        assert admin.config_get("port") == {"port": "0"}
    finally:
        admin.close()
    port = run.secured.env["INORDER_SECURE_REDIS_PORT"]
    users = {client["user"] for client in clients}
    assert {"inorder-consumer", "inorder-sweeper"} <= users
    assert all(client["laddr"].endswith(f":{port}") for client in clients), clients
    kafka = run.secured.kafka_admin()
    [config] = kafka.describe_configs([ConfigResource("broker", "1")]).values()
    found = {name: entry.value for name, entry in config.result(30).items()}
    protocols = dict(p.split(":") for p in found["listener.security.protocol.map"].split(","))
    listening = [item.split("://")[0] for item in found["listeners"].split(",")]
    assert {name: protocols[name] for name in listening} == {
        "SECURE": "SASL_SSL",
        "CONTROLLER": "SSL",  # the broker's own certificate only (mutual TLS)
    }
    port = run.secured.env["INORDER_SECURE_KAFKA_PORT"]
    plain = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "plain-probe"})
    try:
        with pytest.raises(KafkaException):
            plain.list_topics(timeout=5)
    finally:
        plain.close()
