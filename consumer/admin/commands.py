"""``inorder-admin``: what operators see and decide about gaps, parked, held and stopped entities.

It reads the same environment as the consumer and sweeper, and opens only what the
command needs: the read-only commands (lists, ``audit``) need SELECT on the tables
and nothing else, never run DDL and never join a consumer group. Decisions a person
makes (skip, confirm, retry, replay) are recorded with who and why, and the entity is
then drained at once with the consumer's own step code.
"""

from __future__ import annotations

import getpass
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from functools import cached_property
from typing import Any

import orjson
import psycopg
from confluent_kafka import Producer
from psycopg.types.json import set_json_loads
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from consumer.admin import explain, output
from consumer.admin.audit import Audit
from consumer.admin.batches import BatchAdmin
from consumer.errors import AdminError
from consumer.kinds import Links
from consumer.kinds.batches.runner import BatchRunner
from consumer.kinds.projection import ProjectionRoute, stored_row
from consumer.kinds.steps import StepApplier, StepRoute
from consumer.kinds.steps.parking import ParkingLot
from consumer.kinds.steps.store import HELD, NEEDS_REVIEW
from consumer.routes import Route, by_kind
from consumer.settings import SweeperSettings
from consumer.sweeper import gaps
from consumer.sweeper.gaps import GapStatus
from schemas import headers, kafka_key
from schemas.republish import RepublishRequest, encode
from schemas.runtime import kafka_clients
from schemas.runtime.redis_client import RedisClient
from schemas.runtime.redis_client import connect as connect_redis


class Admin:
    """The commands; each connection is opened the first time a command needs it."""

    def __init__(
        self, settings: SweeperSettings, routes: Sequence[Route], console: Console, as_json: bool
    ) -> None:
        self.settings = settings
        self.routes = list(routes)
        self.steps: dict[str, StepRoute] = {r.stream: r for r in by_kind(routes, "step")}
        self.console = console
        self.as_json = as_json
        self._opened: list[Any] = []

    # ------------------------------------------------------------------ connections

    @cached_property
    def conn(self) -> psycopg.Connection[Any]:
        """The consumer's database (autocommit; commands open their own transactions)."""
        conn = psycopg.connect(self.settings.database_url.get_secret_value(), autocommit=True)
        set_json_loads(orjson.loads, conn)
        self._opened.append(conn)
        return conn

    @cached_property
    def redis(self) -> RedisClient:
        """The parking store."""
        if self.settings.redis_url is None:
            raise AdminError("this command reads parked events: set REDIS_URL")
        client = connect_redis(
            self.settings.redis_url.get_secret_value(), socket_timeout=10, socket_connect_timeout=5
        )
        self._opened.append(client)
        return client

    @cached_property
    def lot(self) -> ParkingLot:
        """Parked events, under the consumers' key prefix."""
        return ParkingLot(self.redis, self.settings.redis_key_prefix, self.settings.park_buckets)

    @cached_property
    def producer(self) -> Producer:
        """A producer for republish requests and replayed events (flushed by each command)."""
        return kafka_clients.producer(self.settings, "inorder-admin")

    @cached_property
    def batches(self) -> BatchAdmin:
        """The batch commands."""
        return BatchAdmin(BatchRunner(by_kind(self.routes, "batch")), self.conn, self.show)

    def close(self) -> None:
        """Close whatever the command opened."""
        for opened in self._opened:
            opened.close()

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
        if isinstance(route, StepRoute):
            return StepApplier(route).store.generation(self.conn, entity_id)
        if isinstance(route, ProjectionRoute):
            row = stored_row(self.conn, route, entity_id)
            return None if row is None else int(row["generation"])
        return None

    def entity(self, ref: str) -> tuple[StepApplier, str]:
        """Split ``stream:entity_id`` of a step route and start it (handlers imported).

        Redis is opened only by the commands that drain the entity afterwards.
        """
        route, entity_id = self.routed(ref)
        if not isinstance(route, StepRoute):
            raise AdminError(f"{route.stream!r} is a {route.kind} route; this command is for steps")
        return StepApplier(route), entity_id

    def progress_row(self, applier: StepApplier, entity_id: str) -> tuple[int, int, int | None]:
        """Lock and return (generation, last_applied, stopped_at_seq) of a known entity."""
        row = applier.store.locked(self.conn, entity_id)
        if row is None:
            raise AdminError(
                f"{applier.route.stream}:{entity_id} is unknown: no step progress recorded"
            )
        return row

    # ------------------------------------------------------------------ commands

    def explain(self, ref: str) -> None:
        """One entity's whole story: outbox, applied, parked, held, stopped, gaps, audit."""
        route, entity_id = self.routed(ref)
        lot = self.lot if route.kind == "step" and self.settings.redis_url else None
        source = self.settings.outbox_database_url or self.settings.database_url
        with psycopg.connect(source.get_secret_value(), autocommit=True) as outbox:
            try:
                story = explain.gather(route, entity_id, outbox, self.conn, lot)
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
        self.show("applied", [story.applied] if story.applied else [])
        sections = (
            ("step log", story.step_log),
            ("skipped by a person", story.skips),
            ("external calls not known to have finished", story.uncertain_calls),
            ("parked", [{"seqs": explain.ranges(story.parked)}] if story.parked else []),
            ("gaps", story.gaps),
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
            psycopg.connect(source.get_secret_value()) as outbox,
            Progress(*columns, console=self.console, disable=self.as_json) as progress,
        ):
            audit = Audit(outbox, self.conn, lambda: progress.advance(task))
            task = progress.add_task("auditing entities", total=audit.entities(self.routes))
            report = audit.run(self.routes)
        if report.divergences:
            self.show("divergences", [asdict(d) for d in report.divergences])
        unexplained = len(report.unexplained)
        summary = {
            "entities": report.entities,
            "rows_read": report.rows,
            "divergences": len(report.divergences),
            "unexplained": unexplained,
        }
        self.show("audit", [summary])
        if unexplained:
            raise AdminError(f"{unexplained} unexplained divergence(s); see the table above")

    def gaps_list(self, status: str | None, limit: int) -> None:
        """Gaps, newest first."""
        rows = [_gap_row(g) for g in gaps.listing(self.conn, status, limit)]
        self.show("gaps", rows)

    def gaps_show(self, gap_id: int) -> None:
        """One gap, every field."""
        gap = gaps.get(self.conn, gap_id)
        if gap is None:
            raise AdminError(f"there is no gap {gap_id}")
        self.show(f"gap {gap_id}", [asdict(gap)])

    def parked_top(self, limit: int) -> None:
        """The entities with most parked events, with their oldest park's age."""
        rows: list[dict[str, Any]] = []
        now = time.time()
        for stream in self.steps:
            for entity, size, since in self.lot.sizes(stream):
                rows.append(
                    {
                        "stream": stream,
                        "entity": entity,
                        "parked": size,
                        "oldest_age_s": round(now - since, 1),
                    }
                )
        rows.sort(key=lambda r: -r["parked"])
        self.show("most parked", rows[:limit])

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
        if self.producer.flush(30):
            raise AdminError("Kafka did not take the request; nothing was sent")
        self.show("republish requested", [asdict(request)])

    def skip(self, ref: str, through: int, reason: str, by: str) -> None:
        """A person's decision: the gap's seqs up to ``through`` will never come."""
        applier, entity_id = self.entity(ref)
        stream = applier.route.stream
        if not reason.strip():
            raise AdminError("--reason must say why these seqs are skipped")
        conn = self.conn
        with conn.transaction():
            gap = gaps.find(conn, stream, entity_id)
            if gap is None:
                raise AdminError(f"{ref} has no open gap; nothing to skip")
            if not gap.from_seq <= through <= gap.to_seq:
                raise AdminError(
                    f"--through {through} is outside {ref}'s open gap {gap.from_seq}..{gap.to_seq}"
                )
            generation, last, _ = self.progress_row(applier, entity_id)
            if (generation, last) != (gap.generation, gap.from_seq - 1):
                raise AdminError(f"{ref} moved since the gap was recorded; list the gaps again")
            applier.store.skip(conn, entity_id, (generation, gap.from_seq, through), by, reason)
            if through == gap.to_seq:
                gaps.resolve(conn, gap, GapStatus.SKIPPED, by, reason)
            else:
                gaps.narrow(conn, gap, through + 1)
        self._drain(applier, entity_id)
        skipped = {
            "entity": ref,
            "generation": generation,
            "from_seq": gap.from_seq,
            "through": through,
            "by": by,
            "reason": reason,
        }
        self.show("skipped", [skipped])

    def held_list(self) -> None:
        """Entities whose events went to the held topic or whose gap cannot be repaired."""
        self.rows("held", HELD)

    def held_replay(self, ref: str) -> None:
        """Send the entity's held events back to the events topic and release it."""
        applier, entity_id = self.entity(ref)
        key = kafka_key(applier.route.stream, entity_id)
        reader = kafka_clients.consumer(
            self.settings, "inorder-admin", f"inorder-admin-{uuid.uuid4().hex[:8]}"
        )
        reader.subscribe([self.settings.held_topic])
        sent, idle_since = 0, time.monotonic()
        try:
            while time.monotonic() - idle_since < 3:
                for message in reader.consume(500, 0.5):
                    idle_since = time.monotonic()
                    if message.error() is None and message.key() == key:
                        self._replay(message.value(), key, message.headers())
                        sent += 1
        finally:
            reader.close()
        if self.producer.flush(30):
            raise AdminError("Kafka did not take the replayed events; the entity stays held")
        applier.store.release(self.conn, entity_id)
        self.show("replayed", [{"entity": ref, "events": sent, "to": self.settings.topics[0]}])

    def _replay(self, value: bytes | None, key: bytes, original: Any) -> None:
        pairs: Any = original.items() if isinstance(original, dict) else original or []
        kept = [(k, v) for k, v in pairs if not k.startswith(headers.DLQ_PREFIX)]
        self.producer.produce(self.settings.topics[0], value, key, headers=kept)

    def review_list(self) -> None:
        """Entities stopped for a person, and why."""
        self.rows("needs review", NEEDS_REVIEW)

    def review(self, ref: str, confirm: bool, by: str) -> None:
        """Confirm the stopped step took effect (advance past it) or retry it; then drain."""
        applier, entity_id = self.entity(ref)
        with self.conn.transaction():
            generation, last, stopped = self.progress_row(applier, entity_id)
            if stopped is None:
                raise AdminError(f"{ref} is not waiting for a review")
            if confirm and stopped != last + 1:
                raise AdminError(f"{ref} stopped at {stopped} but has applied only {last}")
            if confirm:
                applier.store.confirm(self.conn, entity_id, generation, stopped, by)
            applier.store.resume(self.conn, entity_id, generation, stopped)
        self._drain(applier, entity_id)
        decision = "confirmed" if confirm else "retried"
        self.show("reviewed", [{"entity": ref, "seq": stopped, "decision": decision, "by": by}])

    def _drain(self, applier: StepApplier, entity_id: str) -> None:
        """Apply whatever became due for the entity, and count it as the consumer would."""
        applier.connect(
            Links(
                self.conn,
                self.redis,
                self.settings.redis_key_prefix,
                self.settings.park_buckets,
            )
        )
        applier.drain(self.conn, [entity_id]).count(applier.route.stream)


def _gap_row(gap: gaps.Gap) -> dict[str, Any]:
    return {
        "id": gap.id,
        "stream": gap.route,
        "entity": gap.entity_id,
        "generation": gap.generation,
        "range": f"{gap.from_seq}..{gap.to_seq}",
        "status": gap.status,
        "attempts": gap.attempts,
        "first_seen": gap.first_seen.isoformat(timespec="seconds"),
        "by": gap.resolved_by,
        "reason": gap.reason,
    }
