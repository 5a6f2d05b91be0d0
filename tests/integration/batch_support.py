"""Helpers for batch tests: a batch route on the test's topics, events, and what came out."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from consumer import tables
from consumer.kinds.batches import BatchRoute
from consumer.kinds.batches.commands import BatchAdmin
from consumer.kinds.batches.runner import BatchRunner
from consumer.routes import parse_routes
from consumer.settings import ConsumerSettings, SweeperSettings
from consumer.sweeper.service import Sweeper, SweepReport
from producer import migrate
from schemas import Event
from schemas.batches import BatchItem, BatchTopics, WorkItem, batch_events, result_event
from schemas.outbox import OutboxEvent
from schemas.runtime.health import Health
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.support.services import Services

KEYS = "ABCDE"


@dataclass(frozen=True)
class BatchSetup:
    """One test's database, topics and consumer settings for a batch route."""

    db: PgSchema
    services: Services
    events: str
    output: str
    work: str
    dlq: str
    settings: ConsumerSettings

    @property
    def route(self) -> BatchRoute:
        """The batch route of the routes file."""
        [route] = parse_routes(self.settings.routes_file.read_text())
        assert isinstance(route, BatchRoute)
        return route

    def send(self, events: list[Event]) -> None:
        """Produce events keyed by entity: different positions may land on different partitions."""
        cs.send_events(self.services.kafka_bootstrap, self.events, events)


def setup(
    db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp: Path,
    *,
    max_retries: int = 0,
    on_incomplete: str = "assemble_incomplete",
    extra: str = "",
) -> BatchSetup:
    """Topics, the outbox table and a routes file with one batch route (``extra``: its
    further lines)."""
    with db.connect(autocommit=True) as conn:
        migrate.apply(conn)
        tables.migrate(conn)
    events, output, work, dlq = (topic_factory(n) for n in ("events", "output", "work", "dlq"))
    routes = tmp / "routes.toml"
    routes.write_text(
        f'[[route]]\nstream = "batch"\nkind = "batch"\noutput_topic = "{output}"\n'
        f'work_topic = "{work}"\nmax_retries = {max_retries}\non_incomplete = "{on_incomplete}"\n'
        + extra
    )
    settings = cs.settings_for(db, services.kafka_bootstrap, routes, events, dlq)
    return BatchSetup(db, services, events, output, work, dlq, settings)


def as_event(o: OutboxEvent) -> Event:
    """The envelope the relay would publish for an outbox event."""
    now = datetime.now(UTC).isoformat()
    return Event(
        o.resolved_event_id,
        o.event_type,
        o.entity_type,
        o.entity_id,
        o.generation,
        o.seq,
        now,
        now,
        dict(o.payload),
    )


def new_id() -> str:
    """A batch id of its own."""
    return f"b-{uuid.uuid4().hex[:10]}"


def accepted(batch_id: str, keys: str = KEYS, **kw: Any) -> Event:
    """The batch.accepted event of a batch whose items are ``keys`` (one letter each)."""
    items = [BatchItem(k, {"letter": k}) for k in keys]
    return as_event(batch_events(batch_id, items, where=BatchTopics(), **kw)[0])


def result(
    batch_id: str,
    position: int,
    key: str | None = None,
    *,
    attempt: int = 1,
    ok: bool = True,
    uncertain: bool = False,
    finished_at: str | None = None,
) -> Event:
    """A worker's answer for one position (key defaults to the letter at that position)."""
    item = WorkItem(batch_id, position, key or KEYS[position - 1], attempt)
    return as_event(
        result_event(
            item,
            result_ref=f"r/{item.item_key}" if ok else None,
            error=None if ok else "worker failed",
            outcome_uncertain=uncertain,
            finished_at=finished_at,
        )
    )


def outputs(db: PgSchema, batch_id: str) -> list[dict[str, Any]]:
    """Every batch.assembled payload written for a batch, oldest revision first."""
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT payload FROM outbox WHERE entity_type = 'batch' AND entity_id = %s "
            "AND event_type = 'batch.assembled' ORDER BY seq",
            (batch_id,),
        ).fetchall()
    return [row[0] for row in rows]


def status(db: PgSchema, batch_id: str) -> tuple[str, str | None, int] | None:
    """(status, reason, revision) of a batch, or None before its manifest is stored."""
    with db.connect() as conn:
        row = conn.execute(
            "SELECT status, reason, revision FROM inorder_batches WHERE batch_id = %s", (batch_id,)
        ).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def states(db: PgSchema, batch_id: str) -> dict[int, str]:
    """position -> state of a batch's manifest rows."""
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT position, state FROM inorder_batch_items WHERE batch_id = %s", (batch_id,)
        ).fetchall()
    return dict(rows)


def work_items(db: PgSchema, batch_id: str) -> list[tuple[int, int]]:
    """(position, attempt) of every work item written for a batch beyond the first attempts."""
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT (payload->>'position')::int, seq FROM outbox "
            "WHERE event_type = 'batch.work_item' AND payload->>'batch_id' = %s AND seq > 1 "
            "ORDER BY id",
            (batch_id,),
        ).fetchall()
    return [(row[0], row[1]) for row in rows]


def positions(payload: dict[str, Any]) -> list[tuple[int, str]]:
    """(position, item_key) of an assembled payload's results, in the order given."""
    return [(r["position"], r["item_key"]) for r in payload["results"]]


def batch_admin(b: BatchSetup, conn: Any) -> tuple[BatchAdmin, list[tuple[str, Any]]]:
    """The batch commands over ``conn``, and what they showed."""
    shown: list[tuple[str, Any]] = []
    admin = BatchAdmin(BatchRunner([b.route]), conn, lambda t, rows: shown.append((t, rows)))
    return admin, shown


def sweep_once(b: BatchSetup) -> SweepReport:
    """One sweep by a sweeper with the test's settings (the batch deadlines are part of it)."""
    s = b.settings
    settings = SweeperSettings(
        DATABASE_URL=b.db.url,
        KAFKA_BOOTSTRAP_SERVERS=b.services.kafka_bootstrap,
        REDIS_URL=b.services.redis_url,
        routes_file=s.routes_file,
        topics=s.topics,
        dead_letter_topic=s.dead_letter_topic,
        create_topics=False,
        http_port=0,
        sweeper_group_id=f"s-{uuid.uuid4().hex[:8]}",
        redis_key_prefix=f"t{uuid.uuid4().hex[:8]}",
    )
    sweeper = Sweeper(settings, parse_routes(s.routes_file.read_text()), Health())
    sweeper.connect()
    try:
        return sweeper.sweep()
    finally:
        sweeper.close()
