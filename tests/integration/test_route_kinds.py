"""Adding a route kind is one module and one registry entry: a new kind runs in the consumer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from consumer.errors import RoutesError
from consumer.kinds import KINDS, Kind, Links, Outcome, Refusal, Spec
from consumer.routes import parse_routes
from consumer.service import ConsumerService
from schemas import Event, headers
from schemas.runtime.health import Health
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.support.kafka import drain, wait_until
from tests.support.services import Services
from tests.support.threads import serving

# ---------------------------------------------------------------- the new kind, whole


@dataclass(frozen=True, slots=True)
class JournalRoute:
    """Keep every event of the stream, once, in a journal table (duplicates are stale)."""

    stream: str
    table: str
    kind: str = field(default="journal", init=False)

    @property
    def streams(self) -> tuple[str, ...]:
        return (self.stream,)

    @property
    def topics(self) -> tuple[str, ...]:
        return ()


def parse_journal(spec: Spec) -> JournalRoute:
    spec.only("journal", {"table"})
    return JournalRoute(spec.stream, spec.identifier("table", spec.values.get("table")))


class JournalApplier:
    def __init__(self, route: JournalRoute) -> None:
        self.route = route

    def connect(self, links: Links) -> None:
        found = links.conn.execute("SELECT to_regclass(%s)", (self.route.table,)).fetchone()
        if found is None or found[0] is None:
            raise RoutesError([f"route {self.route.stream}: create {self.route.table} first"])

    def apply(self, conn, events: Sequence[Event], raw: Mapping[str, bytes]) -> Outcome:
        outcome = Outcome()
        with conn.transaction():
            for event in events:
                if event.seq > 1000:  # this kind's own rule, to show a refusal
                    outcome.refused.append(Refusal(event, "journal_rejected", "seq too large"))
                    continue
                new = conn.execute(
                    f"INSERT INTO {self.route.table} VALUES (%s, %s) "  # noqa: S608
                    "ON CONFLICT DO NOTHING RETURNING 1",
                    (event.entity_id, event.seq),
                ).fetchone()
                (outcome.applied if new else outcome.stale).append(event)
        return outcome


JOURNAL_DDL = "CREATE TABLE note_journal (entity_id text, seq bigint, PRIMARY KEY (entity_id, seq))"
KINDS_WITH_JOURNAL = {**KINDS, "journal": Kind("journal", parse_journal, JournalApplier)}

# ---------------------------------------------------------------- the test


def test_a_new_kind_runs_through_the_consumer_loop(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """A kind added to the registry is parsed, applied and dead-lettered like the others."""
    routes = tmp_path / "routes.toml"
    routes.write_text('[[route]]\nstream = "note"\nkind = "journal"\ntable = "note_journal"\n')
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE note_journal (entity_id text, seq bigint, PRIMARY KEY (entity_id, seq))"
        )
    topic, dlq = topic_factory("events"), topic_factory("dlq")
    settings = cs.settings_for(pg_schema, services.kafka_bootstrap, routes, topic, dlq)
    service = ConsumerService(
        settings,
        parse_routes(routes.read_text(), kinds=KINDS_WITH_JOURNAL),
        Health(),
        kinds=KINDS_WITH_JOURNAL,
    )
    when = "2026-11-30T10:00:00Z"
    notes = [
        Event(f"n1:{seq}", "note.added", "note", "n1", 1, seq, when, when, {})
        for seq in (2, 1, 2, 3, 5000)
    ]
    with serving("consumer", service.run, service.stop):
        cs.send_events(services.kafka_bootstrap, topic, notes)

        def journal() -> list[tuple[str, int]]:
            with pg_schema.connect() as conn:
                return conn.execute("SELECT * FROM note_journal ORDER BY seq").fetchall()

        wait_until(lambda: journal() == [("n1", 1), ("n1", 2), ("n1", 3)])
        [letter] = drain(services.kafka_bootstrap, dlq, expect=1)
    assert dict(letter.headers() or [])[headers.DLQ_REASON] == b"journal_rejected"
