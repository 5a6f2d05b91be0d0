"""One test's pipeline on the secured stack: topics, ACLs, the owner's migrations and
grants, and each program started with its own credentials."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from schemas.security import KafkaNames, Roles, postgres_grants
from tests.secure import stack
from tests.secure.stack import Secured

ROUTES = """
[[route]]
stream = "ledger"
kind = "step"
[route.handlers]
"ledger.added" = "tests.integration.step_handlers:record"

[[route]]
stream = "batch"
kind = "batch"
output_topic = "{output}"
work_topic = "{work}"
"""
ENTITIES, SEQS, LOST = 20, 6, ("e3", 4)
BATCHES, ITEMS = 3, 4


@dataclass
class Run:
    """One test's secured pipeline: names, settings and the processes it started."""

    secured: Secured
    tmp: Path
    names: KafkaNames
    routes: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    oauth: bool = False  # Kafka by OAUTHBEARER (OIDC client credentials), not SCRAM

    def settings(self) -> dict[str, str]:
        """The settings every program shares."""
        n = self.names
        return {
            "INORDER_ROUTES_FILE": str(self.routes),
            "INORDER_TOPICS": f'["{n.events[0]}"]',
            "INORDER_EVENTS_TOPIC": n.events[0],
            "INORDER_WORK_TOPIC": n.work[0],
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
        return stack.program_env(
            self.secured, principal, oauth=self.oauth, **{**self.settings(), **more}
        )

    def start(self, name: str, program: str, principal: str, *argv: str, **more: str) -> None:
        """Start ``program`` (a console script) as ``principal``, logging to ``<name>.log``."""
        with (self.tmp / f"{name}.log").open("ab") as sink:
            self.processes[name] = subprocess.Popen(
                [tool(program), *argv],
                env=self.env(principal, **more),
                stdout=sink,
                stderr=sink,
            )

    def run(
        self, principal: str, program: str, *argv: str, **more: str
    ) -> subprocess.CompletedProcess[str]:
        """Run one command of ``program`` as ``principal`` to its end."""
        return subprocess.run(
            [tool(program), *argv],
            env=self.env(principal, **more),
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


def owner_prepares(run: Run) -> None:
    """The owner migrates the outbox and the consumer's tables, makes the step handler's
    table and grants each program what it needs (a batch route's outbox writes too)."""
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
        grants = postgres_grants(
            Roles(), schema, ["applied_steps"], streams=["ledger"], batch_streams=["batch"]
        )
        for statement in grants:
            conn.execute(statement)


def produce(run: Run) -> None:
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


def produce_batches(run: Run) -> None:
    """The producer's role writes each batch's manifest and work items (the CLI, via emit)."""
    done = run.run(
        "producer", "inorder-producer", "batches", "--count", str(BATCHES), "--items", str(ITEMS)
    )
    assert done.returncode == 0, done.stderr


def start_worker(run: Run) -> None:
    """The example worker as its own principal: reads work items, reports through the outbox."""
    group = run.names.worker_group
    run.start("worker", "inorder-producer", "worker", "worker", INORDER_GROUP_ID=group)
