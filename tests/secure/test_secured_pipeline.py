"""Every program on the secured stack with its own least-privilege credentials, end to end.

TLS on every connection; a PostgreSQL role, a Redis ACL user and a Kafka SCRAM principal
per program; Kafka ACLs from ``schemas.security``; the owner migrates and grants.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import ConfigResource

from schemas import Event, decode
from tests.secure.pipeline import (
    BATCHES,
    ENTITIES,
    LOST,
    SEQS,
    Run,
    owner_prepares,
    produce,
    produce_batches,
    start_worker,
)
from tests.support.kafka import drain, wait_until

pytestmark = [pytest.mark.secure, pytest.mark.timeout(600)]


def test_every_program_runs_end_to_end_with_its_own_least_privilege_credentials(
    run: Run,
) -> None:
    """Relay, two consumers, sweeper, worker and admin over TLS as themselves: a gap heals."""
    owner_prepares(run)
    produce(run)
    produce_batches(run)
    with run.secured.owner() as conn:  # one event lost: behind every relay's cursor
        conn.execute(f"SET search_path = {run.secured.schema}")
        conn.execute("UPDATE outbox SET xid = '0' WHERE entity_id = %s AND seq = %s", LOST)
    run.start("relay", "inorder-relay", "relay")
    run.start("consumer-1", "inorder-consumer", "consumer")
    run.start("consumer-2", "inorder-consumer", "consumer")
    run.start("sweeper", "inorder-sweeper", "sweeper")
    start_worker(run)

    def count(query: str) -> int:
        with run.secured.owner() as conn:
            conn.execute(f"SET search_path = {run.secured.schema}")
            row = conn.execute(query).fetchone()
            return int(row[0]) if row else 0

    wait_until(lambda: count("SELECT count(*) FROM applied_steps") == ENTITIES * SEQS, 180, 1)
    # Each batch assembled by a consumer; its output went out through the outbox (as the
    # consumer's role) and the relay published it to the output topic.
    complete = "SELECT count(*) FROM inorder_batches WHERE status = 'complete'"
    wait_until(lambda: count(complete) == BATCHES, timeout_s=120, interval_s=1)
    output = read_topic(run, run.names.outputs[0], BATCHES)
    assert [event.event_type for event in output] == ["batch.assembled"] * BATCHES
    assert all(event.payload["complete"] for event in output)
    audit = run.run("admin", "inorder-admin", "--json", "audit")
    assert audit.returncode == 0, audit.stderr
    lines = [json.loads(line) for line in audit.stdout.splitlines() if line.startswith("{")]
    summary = next(line for line in reversed(lines) if "unexplained" in line)
    assert summary["unexplained"] == 0, summary
    _every_connection_is_encrypted(run)
    codes = run.stop()
    assert all(code == 0 for code in codes.values()), codes
    _no_output_carries_a_password(run, audit.stdout + audit.stderr)
    with run.secured.owner() as conn:
        conn.execute(f"SET search_path = {run.secured.schema}")
        gaps = conn.execute("SELECT status FROM inorder_gaps").fetchall()
    assert gaps == [("healed",)]


def _no_output_carries_a_password(run: Run, *more: str) -> None:
    """Every program's log and the admin's output, with every principal's password in
    them (each ends in `-%/#@?`): none shows one, as written or percent-encoded."""
    passwords = [
        value
        for name, value in run.secured.env.items()
        if name.startswith("INORDER_SECURE_KAFKA_PASSWORD_")
    ]
    assert passwords
    said = "".join(log.read_text() for log in run.tmp.glob("*.log")) + "".join(more)
    assert said.strip()
    shown = [p for p in passwords if p in said or quote(p, safe="") in said]
    assert shown == []


def read_topic(run: Run, topic: str, count: int) -> list[Event]:
    """``count`` events of ``topic``, read as Kafka's administrator."""
    config = run.secured.kafka_config("super")
    found = drain(config["bootstrap.servers"], topic, expect=count, idle_s=0, client=config)
    return [decode(message.value() or b"") for message in found]


def _every_connection_is_encrypted(run: Run) -> None:
    """Seen from each server: PostgreSQL's sessions all on TLS, every Redis node's clients
    on its TLS port (its plain port closed), every broker's only client listener SASL_SSL."""
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
    seen: set[str] = set()
    for port, node in run.secured.redis_nodes():
        try:
            listed = node.client_list()
            assert node.config_get("port") == {"port": "0"}
            tls = node.config_get("tls-replication") | node.config_get("tls-cluster")
        finally:
            node.close()
        # A replica's own link to its master is listed too (flag M), from a port of its
        # own; replication and the cluster bus are on TLS by configuration.
        clients = [client for client in listed if "M" not in client["flags"]]
        assert all(client["laddr"].endswith(f":{port}") for client in clients), clients
        if run.secured.cluster:
            assert tls == {"tls-replication": "yes", "tls-cluster": "yes"}
        seen.update(client["user"] for client in clients)
    assert {"inorder-consumer", "inorder-sweeper"} <= seen
    assert seen <= {"inorder-consumer", "inorder-sweeper", "inorder-admin", "inorder-super"}
    kafka = run.secured.kafka_admin()
    for broker in run.secured.kafka_brokers():  # one broker per call, as Kafka asks
        [config] = kafka.describe_configs([ConfigResource("broker", broker)]).values()
        found = {name: entry.value for name, entry in config.result(30).items()}
        protocols = dict(p.split(":") for p in found["listener.security.protocol.map"].split(","))
        listening = [item.split("://")[0] for item in found["listeners"].split(",")]
        found_protocols = {name: protocols[name] for name in listening}
        assert found_protocols.pop("CONTROLLER") == "SSL"  # the stack's certificate only
        assert "SECURE" in found_protocols  # SCRAM; the single node adds OAUTH (OAUTHBEARER)
        assert set(found_protocols.values()) == {"SASL_SSL"}, found_protocols
    bootstrap = run.secured.env["INORDER_SECURE_KAFKA_BOOTSTRAP"]
    plain = Consumer({"bootstrap.servers": bootstrap, "group.id": "plain-probe"})
    try:
        with pytest.raises(KafkaException):
            plain.list_topics(timeout=5)
    finally:
        plain.close()
