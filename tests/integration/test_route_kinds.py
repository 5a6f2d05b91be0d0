"""A route kind is one module and one registry entry: it runs in consumer, sweeper and admin."""

from __future__ import annotations

import argparse
import io
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from prometheus_client import REGISTRY, Counter
from pydantic import Field
from rich.console import Console

from consumer import tables
from consumer.admin import cli
from consumer.errors import AdminError, ConsumerError, StartupError
from consumer.kinds import (
    KINDS,
    AdminTools,
    Answered,
    Applier,
    Commands,
    Duties,
    Findings,
    Kind,
    Outcome,
    Refusal,
    Resources,
    Spec,
    SweepReport,
    Tally,
)
from consumer.kinds._audit import Audit
from consumer.routes import parse_routes
from consumer.service import ConsumerService
from consumer.settings import SweeperSettings
from consumer.sweeper.service import Sweeper
from producer import migrate
from schemas import Event, headers
from schemas.republish import RepublishResult, encode
from schemas.runtime.config import InorderSettings
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


# The kind's own vocabulary, all of it here: a process setting, a metric counted from its
# tally, an error under the consumer's root, and a dead-letter reason.
class JournalSettings(InorderSettings):
    """The journal kind's process settings."""

    journal_max_seq: int = Field(default=1000, ge=1, description="Largest seq a journal keeps")


JOURNAL_KEPT = Counter("journal_entries_kept_total", "Journal entries written", ["route"])
JOURNAL_REJECTED = "journal_rejected"


class JournalMissingError(StartupError):
    """Raised at start-up when a journal route's table does not exist."""


@dataclass(slots=True)
class JournalTally(Tally):
    """Entries a share wrote."""

    kept: int = 0

    def count(self, stream: str) -> None:
        JOURNAL_KEPT.labels(stream).inc(self.kept)


def parse_journal(spec: Spec) -> JournalRoute:
    spec.only("journal", {"table"})
    return JournalRoute(spec.stream, spec.identifier("table", spec.values.get("table")))


class JournalApplier(Applier[JournalRoute]):
    def __init__(self, route: JournalRoute) -> None:
        self.route = route
        self.max_seq = 0

    def connect(self, links: Resources[Any]) -> None:
        found = links.conn.execute("SELECT to_regclass(%s)", (self.route.table,)).fetchone()
        if found is None or found[0] is None:
            raise JournalMissingError(f"route {self.route.stream}: create {self.route.table}")
        self.max_seq = links.part(JournalSettings).journal_max_seq

    def apply(self, conn, events: Sequence[Event], raw: Mapping[Event, bytes]) -> Outcome:
        outcome = Outcome(tally=JournalTally())
        with conn.transaction():
            for event in events:
                if event.seq > self.max_seq:  # this kind's own rule, to show a refusal
                    outcome.refused.append(Refusal(event, JOURNAL_REJECTED, "seq too large"))
                    continue
                new = conn.execute(
                    f"INSERT INTO {self.route.table} VALUES (%s, %s) "  # noqa: S608
                    "ON CONFLICT DO NOTHING RETURNING 1",
                    (event.entity_id, event.seq),
                ).fetchone()
                (outcome.applied if new else outcome.stale).append(event)
        outcome.tally = JournalTally(len(outcome.applied))
        return outcome


class JournalDuties(Duties):
    """The sweeper's work for journals: count the entries, and remember the relay's answers."""

    answered: ClassVar[list[RepublishResult]] = []

    def __init__(self, routes: Sequence[JournalRoute], tools: Resources[Any]) -> None:
        self.routes = routes
        self.tools = tools

    def sweep(self, report: SweepReport) -> None:
        for route in self.routes:
            row = self.tools.conn.execute(f"SELECT count(*) FROM {route.table}").fetchone()  # noqa: S608
            report["journal_entries"] += row[0] if row else 0

    def answer(self, result: RepublishResult) -> Answered:
        self.answered.append(result)
        return Answered.UNCHANGED


class JournalInspector:
    """The journal's part of explain, audit and republish."""

    def generation(self, conn: Any, route: JournalRoute, entity_id: str) -> int | None:
        return 7  # a generation only this kind knows, for republish's default

    def story(self, tools: Resources[Any], route: JournalRoute, entity_id: str) -> Findings:
        rows = tools.conn.execute(
            f"SELECT seq FROM {route.table} WHERE entity_id = %s ORDER BY seq",  # noqa: S608
            (entity_id,),
        ).fetchall()
        return Findings(sections={"journal": ("journal", [{"seq": r[0]} for r in rows])})

    def audit(self, audit: Audit, route: JournalRoute) -> None:
        sent = audit.stream(
            audit.outbox,
            "SELECT entity_id, seq FROM outbox WHERE entity_type = %s "  # type: ignore[arg-type]
            'ORDER BY entity_id COLLATE "C", seq',
            (route.stream,),
        )
        kept = audit.stream(
            audit.consumer,
            f'SELECT entity_id, seq FROM {route.table} ORDER BY entity_id COLLATE "C", seq',  # type: ignore[arg-type]  # noqa: S608
            (),
        )
        for entity, events, rows in audit.entity_pairs(sent, kept):
            for _, seq in events:
                if (entity, seq) not in rows:
                    audit.diverge(route.stream, entity, f"seq {seq} not in the journal", None)


def _journal_command(sub: Any) -> None:
    sub.add_parser("journal", help="journal entries per route")


def _run_journal(args: argparse.Namespace, tools: AdminTools, routes: Sequence[Any]) -> None:
    tools.show("journals", [{"route": r.stream, "table": r.table} for r in routes])


JOURNAL_DDL = "CREATE TABLE note_journal (entity_id text, seq bigint, PRIMARY KEY (entity_id, seq))"
KINDS_WITH_JOURNAL = {
    **KINDS,
    "journal": Kind(
        "journal",
        parse_journal,
        JournalApplier,
        duties=JournalDuties,
        inspector=JournalInspector(),
        commands=Commands(("journal",), _journal_command, _run_journal),
        process=JournalSettings,
    ),
}
# The same kind with nothing but its applier: the operator's tools still see it.
BARE_KINDS = {**KINDS, "journal": Kind("journal", parse_journal, JournalApplier)}

# ---------------------------------------------------------------- the test


def test_a_new_kind_runs_through_the_consumer_loop(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kind added to the registry is parsed, applied and dead-lettered like the others,
    under its own setting, reason and metric."""
    monkeypatch.setenv("INORDER_JOURNAL_MAX_SEQ", "100")
    routes = tmp_path / "routes.toml"
    routes.write_text('[[route]]\nstream = "note"\nkind = "journal"\ntable = "note_journal"\n')
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(JOURNAL_DDL)
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
        for seq in (2, 1, 2, 3, 150)
    ]
    kept = REGISTRY.get_sample_value("journal_entries_kept_total", {"route": "note"}) or 0
    with serving("consumer", service.run, service.stop):
        cs.send_events(services.kafka_bootstrap, topic, notes)

        def journal() -> list[tuple[str, int]]:
            with pg_schema.connect() as conn:
                return conn.execute("SELECT * FROM note_journal ORDER BY seq").fetchall()

        wait_until(lambda: journal() == [("n1", 1), ("n1", 2), ("n1", 3)])
        [letter] = drain(services.kafka_bootstrap, dlq, expect=1)
    assert dict(letter.headers() or [])[headers.DLQ_REASON] == JOURNAL_REJECTED.encode()
    after = REGISTRY.get_sample_value("journal_entries_kept_total", {"route": "note"})
    assert after == kept + 3


def test_a_new_kind_s_setting_and_error_stop_start_up_in_one_line(
    pg_schema: PgSchema, services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kind's own bad setting and its own start-up error each end start-up, named."""
    routes = tmp_path / "routes.toml"
    routes.write_text('[[route]]\nstream = "note"\nkind = "journal"\ntable = "note_journal"\n')
    settings = cs.settings_for(pg_schema, services.kafka_bootstrap, routes, "t", "d")
    parsed = parse_routes(routes.read_text(), kinds=KINDS_WITH_JOURNAL)
    missing = ConsumerService(settings, parsed, Health(), kinds=KINDS_WITH_JOURNAL)
    with pytest.raises(JournalMissingError, match="create note_journal") as raised:
        missing.connect()
    missing.resources.close()
    assert isinstance(raised.value, ConsumerError)
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(JOURNAL_DDL)
    monkeypatch.setenv("INORDER_JOURNAL_MAX_SEQ", "0")
    bad = ConsumerService(settings, parsed, Health(), kinds=KINDS_WITH_JOURNAL)
    with pytest.raises(StartupError, match="INORDER_JOURNAL_MAX_SEQ"):
        bad.connect()
    bad.resources.close()


# ---------------------------------------------------------------- beyond the loop


def _admin(settings: SweeperSettings, kinds: Mapping[str, Kind], *argv: str) -> Any:
    """Run one inorder-admin command with these kinds; its JSON lines, parsed."""
    out = io.StringIO()
    routes = parse_routes(settings.routes_file.read_text(), kinds=kinds)
    cli.run(["--json", *argv], settings, routes, Console(file=out), kinds)
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


@pytest.fixture
def journal_setup(pg_schema: PgSchema, services: Services, tmp_path: Path) -> SweeperSettings:
    """An outbox and a journal holding seqs 1 and 2 of three notes sent; sweeper settings."""
    routes = tmp_path / "routes.toml"
    routes.write_text('[[route]]\nstream = "note"\nkind = "journal"\ntable = "note_journal"\n')
    with pg_schema.connect(autocommit=True) as conn:
        migrate.apply(conn)
        tables.migrate(conn)
        conn.execute(JOURNAL_DDL)
        conn.execute("INSERT INTO note_journal VALUES ('n1', 1), ('n1', 2)")
        for seq in (1, 2, 3):
            conn.execute(
                "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
                "payload) VALUES ('t', 'note', 'n1', %s, 'note.added', %s, '{}')",
                (seq, f"n1:{seq}"),
            )
    return SweeperSettings(
        DATABASE_URL=pg_schema.url,
        KAFKA_BOOTSTRAP_SERVERS=services.kafka_bootstrap,
        REDIS_URL=services.redis_url,
        routes_file=routes,
        create_topics=False,
        http_port=0,
        sweeper_group_id=f"s-{uuid.uuid4().hex[:8]}",
        redis_key_prefix=f"t{uuid.uuid4().hex[:8]}",
    )


def test_a_new_kind_s_duties_run_in_a_sweep(
    journal_setup: SweeperSettings, services: Services, topic_factory: TopicFactory
) -> None:
    """The sweeper runs the kind's duties and hands it the relay's results for its streams."""
    settings = journal_setup.model_copy(
        update={"republish_results_topic": topic_factory("results"), "sweep_interval_s": 0.2}
    )
    routes = parse_routes(settings.routes_file.read_text(), kinds=KINDS_WITH_JOURNAL)
    sweeper = Sweeper(settings, routes, Health(), kinds=KINDS_WITH_JOURNAL)
    sweeper.connect()
    assert sweeper.sweep()["journal_entries"] == 2
    result = RepublishResult("r1", "note", "n1", 1, 3, 3, (), (3,), (), False)
    with serving("sweeper", sweeper.run, sweeper.stop):
        cs.send(
            services.kafka_bootstrap, settings.republish_results_topic, [(b"k", encode(result))]
        )
        wait_until(lambda: result in JournalDuties.answered)


def test_a_new_kind_is_explained_and_audited(journal_setup: SweeperSettings) -> None:
    """explain shows the kind's own section and verdict; audit finds its divergence."""
    [head, *_] = _admin(journal_setup, KINDS_WITH_JOURNAL, "explain", "note:n1")
    assert head["journal"] == [{"seq": 1}, {"seq": 2}]
    assert head["verdict"] == "diverges, unexplained: seq 3 not in the journal"
    with pytest.raises(AdminError, match="1 unexplained divergence"):
        _admin(journal_setup, KINDS_WITH_JOURNAL, "audit")


def test_a_new_kind_s_command_and_republish_generation(
    journal_setup: SweeperSettings, topic_factory: TopicFactory
) -> None:
    """inorder-admin dispatches the kind's command; republish defaults to the kind's generation."""
    [shown] = _admin(journal_setup, KINDS_WITH_JOURNAL, "journal")
    assert shown == {"route": "note", "table": "note_journal"}
    settings = journal_setup.model_copy(
        update={"republish_requests_topic": topic_factory("requests")}
    )
    [request] = _admin(settings, KINDS_WITH_JOURNAL, "republish", "note:n1", "--from", "3")
    assert (request["generation"], request["from_seq"], request["to_seq"]) == (7, 3, 3)


def test_a_kind_without_inspector_is_listed_as_not_audited(journal_setup: SweeperSettings) -> None:
    """A kind with no inspector is never skipped silently: audit names its routes."""
    shown = _admin(journal_setup, BARE_KINDS, "audit")
    assert {"stream": "note"} in shown
    assert shown[-1]["not_audited"] == 1
    [head, *_] = _admin(journal_setup, BARE_KINDS, "explain", "note:n1")
    assert head["outbox_rows"] == 3
