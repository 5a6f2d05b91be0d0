"""Helpers for sweeper tests: the whole pipeline (relay, consumer, sweeper) on one test's names."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumer.routes import parse_routes
from consumer.settings import ConsumerSettings, RouteSettings, SweeperSettings
from consumer.sweeper.service import Sweeper
from producer import migrate
from schemas.runtime.health import Health
from tests.conftest import PgSchema, TopicFactory
from tests.integration import relay_support as rs
from tests.integration import step_support as ss
from tests.integration.consumer_support import running as consumer_running
from tests.support.services import ROOT, Services
from tests.support.threads import serving

# Short enough for a test, long enough that an ordinary reorder never counts as a gap.
FAST_REPAIR = {
    "gap_deadline_s": 1.0,
    "republish_backoff_base_s": 1.0,
    "republish_max_attempts": 3,
    "sweep_interval_s": 0.3,
    "lease_ttl_s": 3.0,
    "gauge_interval_s": 1.0,
}


@dataclass(frozen=True)
class Pipeline:
    """One test's topics, routes file and settings (the sweeper's, and the consumer's)."""

    db: PgSchema
    services: Services
    topics: rs.RelayTopics
    settings: SweeperSettings
    group_id: str = field(default_factory=lambda: f"c-{uuid.uuid4().hex[:8]}")

    @property
    def consumer(self) -> ConsumerSettings:
        """The consumer's settings: every setting the routes share with the sweeper's, and
        a consumer group of the test's own."""
        shared = {name: getattr(self.settings, name) for name in RouteSettings.model_fields}
        return ConsumerSettings.model_construct(**shared, group_id=self.group_id)


def pipeline(
    db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp: Path,
    prefix: str,
    *,
    routes_text: str | None = None,
    partitions: int = 3,
    **kw: Any,
) -> Pipeline:
    """Create the tables and topics and build settings shared by consumer, sweeper and admin.

    ``routes_text``: the routes file (default ``ss.routes_text()``); ``partitions``: of
    the events topic.
    """
    ss.prepare(db)
    with db.connect(autocommit=True) as conn:
        migrate.apply(conn)
    topics = rs.RelayTopics(
        topic_factory("events", partitions), topic_factory("requests"), topic_factory("results")
    )
    routes = tmp / "routes.toml"
    routes.write_text(routes_text or ss.routes_text())
    settings = SweeperSettings(
        DATABASE_URL=db.url,
        KAFKA_BOOTSTRAP_SERVERS=services.kafka_bootstrap,
        REDIS_URL=services.redis_url,
        routes_file=routes,
        topics=[topics.events],
        dead_letter_topic=topic_factory("dlq"),
        held_topic=topic_factory("held"),
        republish_requests_topic=topics.requests,
        republish_results_topic=topics.results,
        sweeper_group_id=f"s-{uuid.uuid4().hex[:8]}",
        redis_key_prefix=prefix.rstrip(":"),
        create_topics=False,
        http_port=0,
        **{**FAST_REPAIR, **kw},
    )
    return Pipeline(db, services, topics, settings)


def write_outbox(p: Pipeline, seqs: range, entity: str = "a") -> None:
    """Commit ledger events for ``entity`` with these seqs to the outbox (plain SQL)."""
    with p.db.connect() as conn:
        for seq in seqs:
            conn.execute(
                "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
                "payload) VALUES (%s, 'ledger', %s, %s, 'ledger.added', %s, %s)",
                (p.topics.events, entity, seq, f"{entity}:1:{seq}", f'{{"amount": {seq}}}'),
            )
        conn.commit()


def write_with_a_lost_row(p: Pipeline, seqs: range, lost: int) -> None:
    """``write_outbox``, with the row of seq ``lost`` behind every relay's cursor (never sent
    by publishing: transaction id 0 sorts before any cursor), as a lost event would be."""
    write_outbox(p, seqs)
    with p.db.connect() as conn:
        conn.execute("UPDATE outbox SET xid = '0' WHERE seq = %s", (lost,))
        conn.commit()


@contextmanager
def running(p: Pipeline, *, sweeper: bool = True) -> Iterator[Sweeper | None]:
    """Relay, consumer and (optionally) a sweeper serving until the block ends."""
    relay = rs.settings_for(p.db, p.services.kafka_bootstrap, p.topics, poll_interval_s=0.2)
    with ExitStack() as stack:
        stack.enter_context(rs.running(relay))
        stack.enter_context(consumer_running(p.consumer))
        found = None
        if sweeper:
            found = start_sweeper(p, stack)
        yield found


def start_sweeper(p: Pipeline, stack: ExitStack) -> Sweeper:
    """A sweeper in a thread, stopped when ``stack`` closes."""
    found = Sweeper(p.settings, parse_routes(p.settings.routes_file.read_text()), Health())
    found.connect()
    stack.enter_context(serving("sweeper", found.run, found.stop))
    return found


def gap_rows(p: Pipeline) -> list[tuple[Any, ...]]:
    """(status, from_seq, to_seq, attempts, resolved_by, reason) of every gap, oldest first."""
    with p.db.connect() as conn:
        return conn.execute(
            "SELECT status, from_seq, to_seq, attempts, resolved_by, reason FROM inorder_gaps "
            "ORDER BY id"
        ).fetchall()


def env(p: Pipeline) -> dict[str, str]:
    """Environment for inorder-sweeper / inorder-admin processes with the pipeline's settings."""
    s = p.settings
    out = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    out.update(
        DATABASE_URL=p.db.url,
        KAFKA_BOOTSTRAP_SERVERS=p.services.kafka_bootstrap,
        REDIS_URL=s.redis_url.get_secret_value() if s.redis_url else p.services.redis_url,
        INORDER_ROUTES_FILE=str(s.routes_file),
        INORDER_TOPICS=f'["{s.topics[0]}"]',
        INORDER_HELD_TOPIC=s.held_topic,
        INORDER_DEAD_LETTER_TOPIC=s.dead_letter_topic,
        INORDER_REPUBLISH_REQUESTS_TOPIC=s.republish_requests_topic,
        INORDER_REPUBLISH_RESULTS_TOPIC=s.republish_results_topic,
        INORDER_SWEEPER_GROUP_ID=s.sweeper_group_id,
        INORDER_REDIS_KEY_PREFIX=s.redis_key_prefix,
        INORDER_HTTP_PORT="0",
        INORDER_CREATE_TOPICS="false",
        # The test's step functions live in this repository's tests package.
        PYTHONPATH=str(ROOT),
        **{f"INORDER_{k.upper()}": str(v) for k, v in FAST_REPAIR.items()},
    )
    return out


def tool(name: str) -> str:
    """Path of one of the project's console scripts in this environment."""
    return str(Path(sys.executable).parent / name)


def admin(p: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    """Run inorder-admin with the pipeline's environment."""
    return run_tool("inorder-admin", env(p), *args)


def run_tool(
    name: str, environment: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """Run one of the project's console scripts to the end, capturing its output."""
    return subprocess.run(
        [tool(name), *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
