"""Every program on the secured stack with its own least-privilege credentials, end to end.

TLS on every connection; a PostgreSQL role, a Redis ACL user and a Kafka SCRAM principal
per program; Kafka ACLs from ``schemas.security``; the owner migrates and grants.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import ConfigResource

from schemas.security import KafkaNames, Roles, kafka_acls, postgres_grants
from tests.secure import stack
from tests.secure.stack import Secured
from tests.support.kafka import wait_until

pytestmark = [pytest.mark.secure, pytest.mark.timeout(600)]

ROUTES = """
[[route]]
stream = "ledger"
kind = "step"
[route.handlers]
"ledger.added" = "tests.integration.step_handlers:record"
"""
ENTITIES, SEQS, LOST = 20, 6, ("e3", 4)


@dataclass
class Run:
    """One test's secured pipeline: names, settings and the processes it started."""

    secured: Secured
    tmp: Path
    names: KafkaNames
    routes: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def settings(self) -> dict[str, str]:
        """The settings every program shares."""
        n = self.names
        return {
            "INORDER_ROUTES_FILE": str(self.routes),
            "INORDER_TOPICS": f'["{n.events[0]}"]',
            "INORDER_DEAD_LETTER_TOPIC": n.dead_letters,
            "INORDER_HELD_TOPIC": n.held,
            "INORDER_REPUBLISH_REQUESTS_TOPIC": n.requests,
            "INORDER_REPUBLISH_RESULTS_TOPIC": n.results,
            "INORDER_GROUP_ID": n.consumer_group,
            "INORDER_SWEEPER_GROUP_ID": n.sweeper_group,
            "INORDER_RELAY_GROUP_ID": n.relay_group,
            "INORDER_CREATE_TOPICS": "false",
            "INORDER_REDIS_KEY_PREFIX": f"inorder:{self.secured.schema}",
            "INORDER_HTTP_PORT": "0",
            "INORDER_GAP_DEADLINE_S": "1.0",
            "INORDER_REPUBLISH_BACKOFF_BASE_S": "1.0",
            "INORDER_SWEEP_INTERVAL_S": "0.3",
            "INORDER_LEASE_TTL_S": "3.0",
            "INORDER_PAYLOAD_SCHEMAS": str(stack.ROOT / "tests" / "payload_schemas"),
        }

    def env(self, principal: str, **more: str) -> dict[str, str]:
        """A program's environment, as ``principal``."""
        return stack.program_env(self.secured, principal, **{**self.settings(), **more})

    def start(self, name: str, program: str, principal: str, **more: str) -> None:
        """Start ``program`` (a console script) as ``principal``, logging to ``<name>.log``."""
        with (self.tmp / f"{name}.log").open("ab") as sink:
            self.processes[name] = subprocess.Popen(
                [tool(program)],
                env=self.env(principal, **more),
                stdout=sink,
                stderr=sink,
            )

    def run(self, principal: str, program: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run one command of ``program`` as ``principal`` to its end."""
        return subprocess.run(
            [tool(program), *argv],
            env=self.env(principal),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def stop(self) -> dict[str, int | None]:
        """SIGTERM every process; their exit codes."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        return {name: p.wait(60) for name, p in self.processes.items()}


def tool(name: str) -> str:
    """The console script ``name`` of this environment."""
    return str(Path(sys.executable).parent / name)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    with stack.secured() as secured:
        tag = uuid.uuid4().hex[:8]
        names = KafkaNames(
            events=[f"sec.{tag}.events"],
            dead_letters=f"sec.{tag}.dlq",
            held=f"sec.{tag}.held",
            requests=f"sec.{tag}.requests",
            results=f"sec.{tag}.results",
            consumer_group=f"sec.{tag}.consumer",
            sweeper_group=f"sec.{tag}.sweeper",
            relay_group=f"sec.{tag}.relay",
        )
        admin = secured.kafka_admin()
        stack.create_topics(
            admin,
            [*names.events, names.dead_letters, names.held, names.requests, names.results],
        )
        bindings = stack.apply_acls(admin, kafka_acls(names))
        routes = tmp_path / "routes.toml"
        routes.write_text(ROUTES)
        found = Run(secured, tmp_path, names, routes)
        try:
            yield found
        finally:
            found.stop()
            stack.delete_acls(admin, bindings)


def _owner_prepares(run: Run) -> None:
    """The owner migrates the outbox and the consumer's tables, makes the step handler's
    table and grants each program what it needs."""
    done = run.run("owner", "inorder-producer", "migrate")
    assert done.returncode == 0, done.stderr
    done = run.run("owner", "inorder-consumer", "migrate")
    assert done.returncode == 0, done.stderr
    schema = run.secured.schema
    with run.secured.owner() as conn:
        conn.execute(f"SET search_path = {schema}")
        conn.execute(
            "CREATE TABLE applied_steps (entity_id text, generation bigint, seq bigint, "
            "event_type text)"
        )
        for statement in postgres_grants(Roles(), schema, projections=["applied_steps"]):
            conn.execute(statement)


def _produce(run: Run) -> None:
    """The producer's role writes every event (plain SQL on its columns)."""
    rows = [
        (run.names.events[0], f"e{e}", s, f"e{e}:1:{s}")
        for e in range(ENTITIES)
        for s in range(1, SEQS + 1)
    ]
    with stack.psycopg.connect(run.secured.database_url("producer")) as conn:
        conn.cursor().executemany(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
            "payload) VALUES (%s, 'ledger', %s, %s, 'ledger.added', %s, '{}')",
            rows,
        )
        conn.commit()


def test_every_program_runs_end_to_end_with_its_own_least_privilege_credentials(
    run: Run,
) -> None:
    """Relay, two consumers, sweeper and admin over TLS as themselves: a lost event heals."""
    _owner_prepares(run)
    _produce(run)
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
