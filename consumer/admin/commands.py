"""``inorder-admin``'s generic commands and the tools every kind's own commands are given.

It reads the same environment as the consumer and sweeper, and opens only what the
command needs: the read-only commands (lists, ``audit``, ``explain``) need SELECT on
the tables and nothing else, never run DDL and never join a consumer group.
``republish``, ``audit`` and ``explain`` work for every routed stream, each kind's
inspector giving its part; the rest are the kinds' own (``consumer.kinds``).
"""

from __future__ import annotations

import getpass
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import psycopg
from psycopg.rows import dict_row
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from consumer.admin import explain, output
from consumer.admin.sources import outbox_rows
from consumer.errors import AdminError
from consumer.kinds import KINDS, AdminTools, Kind, Route
from consumer.kinds._audit import Audit
from consumer.kinds._plugin import ranges
from consumer.settings import SweeperSettings
from schemas.republish import RepublishRequest, encode
from schemas.runtime import kafka_watch, postgres


class Admin(AdminTools):
    """The commands; each connection is opened the first time a command needs it."""

    def __init__(
        self,
        settings: SweeperSettings,
        routes: Sequence[Route],
        console: Console,
        as_json: bool,
        kinds: Mapping[str, Kind] = KINDS,
    ) -> None:
        super().__init__(settings, "inorder-admin")
        self.routes = list(routes)
        self.kinds = kinds
        self.console = console
        self.as_json = as_json

    # ------------------------------------------------------------------ output

    def show(self, title: str, rows: Sequence[dict[str, Any]]) -> None:
        """Rows as a table (TSV when not on a terminal), or JSON lines for scripts."""
        output.show(self.console, title, rows, self.as_json)

    def rows(self, title: str, query: str) -> None:
        """Show what a read-only statement answers, one row per line."""
        cur = self.conn.execute(query)
        names = [c.name for c in cur.description or ()]
        self.show(title, [dict(zip(names, r, strict=True)) for r in cur.fetchall()])

    # ------------------------------------------------------------------ helpers

    def routed(self, ref: str) -> tuple[Route, str]:
        """Split ``stream:entity_id`` of any stream the routes file routes."""
        stream, sep, entity_id = ref.partition(":")
        if not sep or not entity_id:
            raise AdminError(f"{ref!r} is not stream:entity_id")
        for route in self.routes:
            if stream in route.streams:
                return route, entity_id
        raise AdminError(f"{stream!r} is not routed in {self.settings.routes_file}")

    def current_generation(self, route: Route, entity_id: str) -> int | None:
        """The generation the consumer holds for an entity (None: nothing applied yet)."""
        inspector = self.kinds[route.kind].inspector
        return None if inspector is None else inspector.generation(self.conn, route, entity_id)

    def run_kind_command(self, name: str, args: Any) -> None:
        """Run a command a kind added, over that kind's routes."""
        for kind_name, kind in self.kinds.items():
            if kind.commands is not None and name in kind.commands.names:
                routes = [r for r in self.routes if r.kind == kind_name]
                kind.commands.run(args, self, routes)
                return
        raise AdminError(f"no route kind has a command {name!r}")

    # ------------------------------------------------------------------ commands

    def explain(self, ref: str) -> None:
        """One entity's whole story: outbox, applied, parked, held, stopped, gaps, audit."""
        route, entity_id = self.routed(ref)
        source = self.settings.outbox_database_url or self.settings.database_url
        with postgres.connect(source, "inorder-admin") as outbox:
            try:
                relation = outbox_rows(outbox, self.settings)
                story = explain.gather(route, entity_id, outbox, self, self.kinds, relation)
            except psycopg.errors.UndefinedTable as exc:
                raise AdminError(
                    f"{exc.diag.message_primary}: the outbox and the consumer's tables are "
                    "needed; set INORDER_OUTBOX_DATABASE_URL when the outbox is elsewhere"
                ) from exc
        if not story.known:
            raise AdminError(f"{ref}: nothing known, in the outbox or in the consumer")
        if self.as_json:
            self.console.file.write(output.json_line(story.as_dict()))
            return
        shown = story.outbox_rows - len(story.outbox)
        self.show(
            f"{ref} ({route.kind} route)",
            [{"outbox rows": story.outbox_rows, "verdict": explain.verdict(story)}],
        )
        self.show("outbox" + (f" (newest; {shown} older not shown)" if shown else ""), story.outbox)
        held = story.held
        self.show("applied", [held.applied] if held.applied else [])
        sections = (
            *held.sections.values(),
            ("parked", [{"seqs": ranges(held.parked)}] if held.parked else []),
            ("dead letters", story.dead_letters),
            ("audit", [asdict(d) for d in story.divergences]),
        )
        for title, rows in sections:
            if rows:
                self.show(title, rows)

    def audit(self) -> None:
        """Compare the outbox with every route's tables; fail on unexplained divergences."""
        source = self.settings.outbox_database_url or self.settings.database_url
        columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with (
            postgres.connect(source, "inorder-admin", autocommit=False) as outbox,
            Progress(*columns, console=self.console, disable=self.as_json) as progress,
        ):
            rows = outbox_rows(outbox, self.settings)
            audit = Audit(
                outbox, self.conn, self.kinds, lambda: progress.advance(task), source=rows
            )
            task = progress.add_task("auditing entities", total=audit.entities(self.routes))
            report = audit.run(self.routes)
        if report.divergences:
            self.show("divergences", [asdict(d) for d in report.divergences])
        if report.not_audited:
            self.show("not audited (no inspector)", [{"stream": s} for s in report.not_audited])
        replayed = self._replayed_letters()
        if replayed:
            self.show("dead letters replayed", replayed)
        unexplained = len(report.unexplained)
        summary = {
            "entities": report.entities,
            "rows_read": report.rows,
            "divergences": len(report.divergences),
            "unexplained": unexplained,
            "not_audited": len(report.not_audited),
            "healed_by_snapshot": len(report.healed_by_snapshot),
            "letters_replayed": len(replayed),
        }
        self.show("audit", [summary])
        if unexplained:
            raise AdminError(f"{unexplained} unexplained divergence(s); see the table above")

    def _replayed_letters(self) -> list[dict[str, Any]]:
        """Each dead letter a person replayed: what, from where, by whom, when and why."""
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                "SELECT d.id, d.entity_type || ':' || d.entity_id AS entity, d.generation, "
                "d.seq, d.reason, x.source AS replayed_from, x.done_by AS by, x.done_at AS at, "
                "x.reason AS why FROM inorder_dead_letters d JOIN inorder_dead_letter_decisions "
                "x ON x.letter_id = d.id WHERE x.decision = 'replayed' ORDER BY x.done_at, d.id"
            ).fetchall()

    def republish(
        self, ref: str, from_seq: int, to_seq: int | None, generation: int | None
    ) -> None:
        """Ask the relay to re-send a range of any routed stream, as the sweeper would."""
        route, entity_id = self.routed(ref)
        last = to_seq if to_seq is not None else from_seq
        if from_seq < 1 or last < from_seq:
            raise AdminError(f"--from {from_seq} --to {last} is not a range of seqs")
        if generation is None:
            generation = self.current_generation(route, entity_id) or 1
        request = RepublishRequest(
            f"manual-{uuid.uuid4().hex[:12]}",
            route.stream,
            entity_id,
            generation,
            from_seq,
            last,
            f"requested by {getpass.getuser()}",
        )
        self.producer.produce(self.settings.republish_requests_topic, encode(request), request.key)
        why = kafka_watch.unsent(self.producer, 30)
        if why:
            raise AdminError(f"nothing was sent: {why}")
        self.show("republish requested", [asdict(request)])
