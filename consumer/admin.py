"""``inorder-admin``: what operators see and decide about gaps, parked, held and stopped entities.

It reads the same environment as the consumer and sweeper. Decisions a person makes
(skip, confirm, retry, replay) are recorded with who and why, and the entity is then
drained at once with the consumer's own step code.
"""

from __future__ import annotations

import getpass
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import orjson
import psycopg
from confluent_kafka import Consumer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from consumer import gaps
from consumer.audit import Audit
from consumer.batch_admin import BatchAdmin
from consumer.errors import ConsumerError
from consumer.routes import StepRoute, parse_routes
from consumer.settings import SweeperSettings
from consumer.sweeper import Sweeper
from schemas import headers, kafka_key
from schemas.health import Health
from schemas.republish import RepublishRequest, encode


class AdminError(ConsumerError):
    """Raised when an operator command cannot be done as asked; the message says why."""


class Admin:
    """The commands, over one sweeper's connections (for its stores, parking lot and drain)."""

    def __init__(self, settings: SweeperSettings, console: Console, as_json: bool) -> None:
        self.settings = settings
        routes = parse_routes(settings.routes_file.read_text(), str(settings.routes_file))
        self.routes = routes
        self.steps = {r.stream: r for r in routes if isinstance(r, StepRoute)}
        self.sweeper = Sweeper(settings, routes, Health())
        self.sweeper.connect()
        self.io = self.sweeper.io
        self.console = console
        self.as_json = as_json
        self.batches = BatchAdmin(self.sweeper.batches, self.io.conn, self.show)

    # ------------------------------------------------------------------ output

    def show(self, title: str, rows: Sequence[dict[str, Any]]) -> None:
        """Rows as a table for people, or JSON lines for scripts."""
        if self.as_json:
            for row in rows:  # one compact object per line
                self.console.file.write(orjson.dumps(row, default=str).decode() + "\n")
            return
        table = Table(title=title)
        for column in rows[0] if rows else ["(none)"]:
            table.add_column(column)
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row.values()))
        self.console.print(table)

    # ------------------------------------------------------------------ helpers

    def entity(self, ref: str) -> tuple[str, str]:
        """Split ``stream:entity_id`` and check that the stream is a step route."""
        stream, sep, entity_id = ref.partition(":")
        if not sep or not entity_id:
            raise AdminError(f"{ref!r} is not stream:entity_id")
        if stream not in self.steps:
            raise AdminError(f"{stream!r} is not a step route in {self.settings.routes_file}")
        return stream, entity_id

    def progress_row(self, stream: str, entity_id: str) -> tuple[Any, ...]:
        """Lock and return (generation, last_applied, stopped_at_seq) of a known entity."""
        row = self.io.conn.execute(
            "SELECT generation, last_applied, stopped_at_seq FROM inorder_step_progress "
            "WHERE route = %s AND entity_id = %s FOR UPDATE",
            (stream, entity_id),
        ).fetchone()
        if row is None:
            raise AdminError(f"{stream}:{entity_id} is unknown: no step progress recorded")
        return tuple(row)

    def drain(self, stream: str, entity_id: str) -> None:
        """Apply whatever became due for the entity."""
        self.io.runner.drain(self.io.conn, stream, [entity_id])

    # ------------------------------------------------------------------ commands

    def audit(self) -> None:
        """Compare the outbox with every route's tables; fail on unexplained divergences."""
        source = self.settings.outbox_database_url or self.settings.database_url
        columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with (
            psycopg.connect(source.get_secret_value()) as outbox,
            Progress(*columns, console=self.console, disable=self.as_json) as progress,
        ):
            audit = Audit(outbox, self.io.conn, lambda: progress.advance(task))
            task = progress.add_task("auditing entities", total=audit.entities(self.routes))
            report = audit.run(self.routes)
        if report.divergences:
            self.show("divergences", [asdict(d) for d in report.divergences])
        unexplained = len(report.unexplained)
        summary = {"entities": report.entities, "rows_read": report.rows,
                   "divergences": len(report.divergences), "unexplained": unexplained}  # fmt: skip
        self.show("audit", [summary])
        if unexplained:
            raise AdminError(f"{unexplained} unexplained divergence(s); see the table above")

    def gaps_list(self, status: str | None, limit: int) -> None:
        """Gaps, newest first."""
        rows = [_gap_row(g) for g in gaps.listing(self.io.conn, status, limit)]
        self.show("gaps", rows)

    def gaps_show(self, gap_id: int) -> None:
        """One gap, every field."""
        gap = gaps.get(self.io.conn, gap_id)
        if gap is None:
            raise AdminError(f"there is no gap {gap_id}")
        self.show(f"gap {gap_id}", [asdict(gap)])

    def parked_top(self, limit: int) -> None:
        """The entities with most parked events, with their oldest park's age."""
        rows: list[dict[str, Any]] = []
        client, now = self.io.lot.client, time.time()
        for stream in self.steps:
            raw: Any = client.zrange(self.io.lot.index_key(stream), 0, 99_999, withscores=True)
            entries: list[tuple[bytes, float]] = list(raw)
            with client.pipeline(transaction=False) as pipe:
                for entity, _ in entries:
                    pipe.zcard(self.io.lot.entity_key(stream, entity.decode()))
                sizes = pipe.execute()
            for (entity, since), size in zip(entries, sizes, strict=True):
                rows.append({"stream": stream, "entity": entity.decode(), "parked": size,
                             "oldest_age_s": round(now - since, 1)})  # fmt: skip
        rows.sort(key=lambda r: -r["parked"])
        self.show("most parked", rows[:limit])

    def republish(
        self, ref: str, from_seq: int, to_seq: int | None, generation: int | None
    ) -> None:
        """Ask the relay to re-send a range, as the sweeper would."""
        stream, entity_id = self.entity(ref)
        last = to_seq if to_seq is not None else from_seq
        if from_seq < 1 or last < from_seq:
            raise AdminError(f"--from {from_seq} --to {last} is not a range of seqs")
        if generation is None:
            row = self.io.conn.execute(
                "SELECT generation FROM inorder_step_progress WHERE route = %s AND entity_id = %s",
                (stream, entity_id),
            ).fetchone()
            generation = int(row[0]) if row else 1
        request = RepublishRequest(
            f"manual-{uuid.uuid4().hex[:12]}", stream, entity_id, generation, from_seq, last,
            f"requested by {getpass.getuser()}",
        )  # fmt: skip
        self.io.producer.produce(
            self.settings.republish_requests_topic, encode(request), request.key
        )
        if self.io.producer.flush(30):
            raise AdminError("Kafka did not take the request; nothing was sent")
        self.show("republish requested", [asdict(request)])

    def skip(self, ref: str, through: int, reason: str, by: str) -> None:
        """A person's decision: the gap's seqs up to ``through`` will never come."""
        stream, entity_id = self.entity(ref)
        if not reason.strip():
            raise AdminError("--reason must say why these seqs are skipped")
        conn = self.io.conn
        with conn.transaction():
            gap = gaps.find(conn, stream, entity_id)
            if gap is None:
                raise AdminError(f"{ref} has no open gap; nothing to skip")
            if not gap.from_seq <= through <= gap.to_seq:
                raise AdminError(
                    f"--through {through} is outside {ref}'s open gap {gap.from_seq}..{gap.to_seq}"
                )
            generation, last, _ = self.progress_row(stream, entity_id)
            if (generation, last) != (gap.generation, gap.from_seq - 1):
                raise AdminError(f"{ref} moved since the gap was recorded; list the gaps again")
            conn.execute(
                "UPDATE inorder_step_progress SET last_applied = %s, held_at = NULL, "
                "updated_at = now() WHERE route = %s AND entity_id = %s",
                (through, stream, entity_id),
            )
            conn.execute(
                "INSERT INTO inorder_step_skips (route, entity_id, generation, from_seq, to_seq, "
                "skipped_by, reason) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (stream, entity_id, generation, gap.from_seq, through, by, reason),
            )
            if through == gap.to_seq:
                gaps.resolve(conn, gap, "skipped", by, reason)
            else:
                conn.execute(
                    "UPDATE inorder_gaps SET from_seq = %s WHERE id = %s", (through + 1, gap.id)
                )
        self.drain(stream, entity_id)
        self.show("skipped", [{"entity": ref, "generation": generation, "from_seq": gap.from_seq,
                               "through": through, "by": by, "reason": reason}])  # fmt: skip

    def held_list(self) -> None:
        """Entities whose events went to the held topic or whose gap cannot be repaired."""
        rows = self.io.conn.execute(
            "SELECT route, entity_id, generation, last_applied, held_at FROM inorder_step_progress "
            "WHERE held_at IS NOT NULL ORDER BY held_at"
        ).fetchall()
        names = ("stream", "entity", "generation", "last_applied", "held_at")
        self.show("held", [dict(zip(names, r, strict=True)) for r in rows])

    def held_replay(self, ref: str) -> None:
        """Send the entity's held events back to the events topic and release it."""
        stream, entity_id = self.entity(ref)
        key = kafka_key(stream, entity_id)
        config = self.settings.kafka_config()
        reader = Consumer(
            {**config, "group.id": f"inorder-admin-{uuid.uuid4().hex[:8]}",
             "auto.offset.reset": "earliest", "enable.auto.commit": False}
        )  # fmt: skip
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
        if self.io.producer.flush(30):
            raise AdminError("Kafka did not take the replayed events; the entity stays held")
        self.io.conn.execute(
            "UPDATE inorder_step_progress SET held_at = NULL WHERE route = %s AND entity_id = %s",
            (stream, entity_id),
        )
        self.show("replayed", [{"entity": ref, "events": sent, "to": self.settings.topics[0]}])

    def _replay(self, value: bytes | None, key: bytes, original: Any) -> None:
        pairs: Any = original.items() if isinstance(original, dict) else original or []
        kept = [(k, v) for k, v in pairs if not k.startswith(headers.DLQ_PREFIX)]
        self.io.producer.produce(self.settings.topics[0], value, key, headers=kept)

    def review_list(self) -> None:
        """Entities stopped for a person, and why."""
        rows = self.io.conn.execute(
            "SELECT route, entity_id, generation, last_applied, stopped_at_seq, stop_reason "
            "FROM inorder_step_progress WHERE stopped_at_seq IS NOT NULL ORDER BY updated_at"
        ).fetchall()
        names = ("stream", "entity", "generation", "last_applied", "stopped_at", "reason")
        self.show("needs review", [dict(zip(names, r, strict=True)) for r in rows])

    def review(self, ref: str, confirm: bool, by: str) -> None:
        """Confirm the stopped step took effect (advance past it) or retry it; then drain."""
        stream, entity_id = self.entity(ref)
        conn = self.io.conn
        with conn.transaction():
            generation, last, stopped = self.progress_row(stream, entity_id)
            if stopped is None:
                raise AdminError(f"{ref} is not waiting for a review")
            if confirm:
                self._confirm(stream, entity_id, generation, last, stopped, by)
            conn.execute(
                "DELETE FROM inorder_step_attempts WHERE route = %s AND entity_id = %s "
                "AND generation = %s AND seq = %s AND completed_at IS NULL",
                (stream, entity_id, generation, stopped),
            )
            conn.execute(
                "UPDATE inorder_step_progress SET stopped_at_seq = NULL, stop_reason = NULL, "
                "updated_at = now() WHERE route = %s AND entity_id = %s",
                (stream, entity_id),
            )
        self.drain(stream, entity_id)
        self.show("reviewed", [{"entity": ref, "seq": stopped, "decision":
                                "confirmed" if confirm else "retried", "by": by}])  # fmt: skip

    def _confirm(
        self, stream: str, entity_id: str, generation: int, last: int, seq: int, by: str
    ) -> None:
        if seq != last + 1:
            raise AdminError(f"{stream}:{entity_id} stopped at {seq} but has applied only {last}")
        conn = self.io.conn
        conn.execute(
            "UPDATE inorder_step_attempts SET completed_at = now() WHERE route = %s "
            "AND entity_id = %s AND generation = %s AND seq = %s",
            (stream, entity_id, generation, seq),
        )
        conn.execute(
            "UPDATE inorder_step_progress SET last_applied = %s"
            " WHERE route = %s AND entity_id = %s",
            (seq, stream, entity_id),
        )
        conn.execute(
            "INSERT INTO inorder_step_log (route, entity_id, generation, seq, event_id,"
            " event_type) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (stream, entity_id, generation, seq, f"confirmed-by:{by}", "(confirmed by a person)"),
        )


def _gap_row(gap: gaps.Gap) -> dict[str, Any]:
    return {
        "id": gap.id, "stream": gap.route, "entity": gap.entity_id, "generation": gap.generation,
        "range": f"{gap.from_seq}..{gap.to_seq}", "status": gap.status, "attempts": gap.attempts,
        "first_seen": gap.first_seen.isoformat(timespec="seconds"), "by": gap.resolved_by,
        "reason": gap.reason,
    }  # fmt: skip
