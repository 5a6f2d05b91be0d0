"""The step kind's ``inorder-admin`` commands: gaps, parked, skip, held and review.

Decisions a person makes (skip, confirm, retry, replay) are recorded with who and
why, and the entity is then drained at once with the consumer's own step code.
"""

from __future__ import annotations

import argparse
import getpass
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from consumer.errors import AdminError
from consumer.kinds._base import Links
from consumer.kinds._plugin import AdminTools, Commands
from consumer.kinds.steps import gaps
from consumer.kinds.steps.duties import drain
from consumer.kinds.steps.gaps import GapStatus
from consumer.kinds.steps.parking import lot_of
from consumer.kinds.steps.route import StepRoute
from consumer.kinds.steps.runner import StepApplier
from consumer.kinds.steps.store import HELD, NEEDS_REVIEW, RETRYING
from schemas import headers, kafka_key, tracing
from schemas.runtime import kafka_clients

ENTITY = "STREAM:ENTITY_ID, e.g. seat_ledger:sub-1"


def add(sub: Any) -> None:
    """The step commands in inorder-admin's command line."""
    g = sub.add_parser("gaps", help="gaps the sweeper found").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    listing = g.add_parser("list", help="gaps, newest first")
    listing.add_argument("--status", choices=list(GapStatus), help="only gaps in this status")
    listing.add_argument("--limit", type=int, default=50, help="most rows (default 50)")
    g.add_parser("show", help="every field of one gap").add_argument(
        "id", type=int, metavar="ID", help="the gap's id"
    )
    sub.add_parser("parked", help="parked events").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    ).add_parser(
        "top", help="entities with most parked events and their oldest park's age"
    ).add_argument("--limit", type=int, default=20, help="most rows (default 20)")
    skip = sub.add_parser(
        "skip",
        help="a person's decision that seqs of the open gap will never come: recorded in "
        "inorder_step_skips with who, when and why; the entity moves on and drains",
    )
    skip.add_argument("entity", metavar="STREAM:ENTITY", help=ENTITY)
    skip.add_argument("--through", type=int, required=True, help="last seq that will not come")
    skip.add_argument("--reason", required=True, help="why (required, not empty)")
    skip.add_argument("--by", default=getpass.getuser(), help="who decides (default: you)")
    held = sub.add_parser("held", help="entities whose parking set was full").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    held.add_parser("list", help="held entities")
    held.add_parser(
        "replay", help="send an entity's held events back to the events topic"
    ).add_argument("entity", metavar="STREAM:ENTITY", help=ENTITY)
    review = sub.add_parser("review", help="steps stopped for a person").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    review.add_parser("list", help="steps stopped for a person, with the reason")
    review.add_parser(
        "retrying", help="steps waiting for their next call (a retry table), soonest first"
    )
    for action, what in (
        ("confirm", "the earlier call took effect: advance past it"),
        ("retry", "it did not: run it again"),
    ):
        cmd = review.add_parser(action, help=what)
        cmd.add_argument("entity", metavar="STREAM:ENTITY", help=ENTITY)
        cmd.add_argument("--by", default=getpass.getuser(), help="who decides (default: you)")


def run(args: argparse.Namespace, tools: AdminTools, routes: Sequence[StepRoute]) -> None:
    """Run one parsed step command."""
    steps = StepCommands(tools, routes)
    match (args.command, getattr(args, "action", None)):
        case ("gaps", "list"):
            steps.gaps_list(args.status, args.limit)
        case ("gaps", "show"):
            steps.gaps_show(args.id)
        case ("parked", "top"):
            steps.parked_top(args.limit)
        case ("skip", _):
            steps.skip(args.entity, args.through, args.reason, args.by)
        case ("held", "list"):
            tools.rows("held", HELD)
        case ("held", "replay"):
            steps.held_replay(args.entity)
        case ("review", "list"):
            tools.rows("needs review", NEEDS_REVIEW)
        case ("review", "retrying"):
            tools.rows("retrying", RETRYING)
        case ("review", action):
            steps.review(args.entity, action == "confirm", args.by)


COMMANDS = Commands(("gaps", "parked", "skip", "held", "review"), add, run)


class StepCommands:
    """The step commands over the program's tools and the routes file's step routes."""

    def __init__(self, tools: AdminTools, routes: Sequence[StepRoute]) -> None:
        self.tools = tools
        self.steps = {r.stream: r for r in routes}

    def entity(self, ref: str) -> tuple[StepApplier, str]:
        """Split ``stream:entity_id`` of a step route and start it (handlers imported).

        Redis is opened only by the commands that drain the entity afterwards.
        """
        route, entity_id = self.tools.routed(ref)
        if route.stream not in self.steps:
            raise AdminError(f"{route.stream!r} is a {route.kind} route; this command is for steps")
        return StepApplier(self.steps[route.stream]), entity_id

    def progress_row(self, applier: StepApplier, entity_id: str) -> tuple[int, int, int | None]:
        """Lock and return (generation, last_applied, stopped_at_seq) of a known entity."""
        row = applier.store.locked(self.tools.conn, entity_id)
        if row is None:
            raise AdminError(
                f"{applier.route.stream}:{entity_id} is unknown: no step progress recorded"
            )
        return row

    def gaps_list(self, status: str | None, limit: int) -> None:
        """Gaps, newest first."""
        rows = [_gap_row(g) for g in gaps.listing(self.tools.conn, status, limit)]
        self.tools.show("gaps", rows)

    def gaps_show(self, gap_id: int) -> None:
        """One gap, every field."""
        gap = gaps.get(self.tools.conn, gap_id)
        if gap is None:
            raise AdminError(f"there is no gap {gap_id}")
        self.tools.show(f"gap {gap_id}", [asdict(gap)])

    def parked_top(self, limit: int) -> None:
        """The entities with most parked events, with their oldest park's age."""
        rows: list[dict[str, Any]] = []
        lot = lot_of(self.tools)
        for stream in self.steps:
            now = lot.now(stream)
            for entity, size, since in lot.sizes(stream):
                rows.append(
                    {
                        "stream": stream,
                        "entity": entity,
                        "parked": size,
                        "oldest_age_s": round(now - since, 1),
                    }
                )
        rows.sort(key=lambda r: -r["parked"])
        self.tools.show("most parked", rows[:limit])

    def skip(self, ref: str, through: int, reason: str, by: str) -> None:
        """A person's decision: the gap's seqs up to ``through`` will never come."""
        applier, entity_id = self.entity(ref)
        stream = applier.route.stream
        if not reason.strip():
            raise AdminError("--reason must say why these seqs are skipped")
        conn = self.tools.conn
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
        self.tools.show("skipped", [skipped])

    def held_replay(self, ref: str) -> None:
        """Send the entity's held events back to the events topic and release it."""
        applier, entity_id = self.entity(ref)
        settings, producer = self.tools.settings, self.tools.producer
        key = kafka_key(applier.route.stream, entity_id)
        reader = kafka_clients.consumer(
            settings, "inorder-admin", f"inorder-admin-{uuid.uuid4().hex[:8]}"
        )
        reader.subscribe([settings.held_topic])
        sent, idle_since = 0, time.monotonic()
        try:
            while time.monotonic() - idle_since < 3:
                for message in reader.consume(500, 0.5):
                    idle_since = time.monotonic()
                    if message.error() is None and message.key() == key:
                        pairs: Any = message.headers() or []
                        kept = [(k, v) for k, v in pairs if not headers.about_a_letter(k)]
                        producer.produce(settings.topics[0], message.value(), key, headers=kept)
                        sent += 1
        finally:
            reader.close()
        if producer.flush(30):
            raise AdminError("Kafka did not take the replayed events; the entity stays held")
        applier.store.release(self.tools.conn, entity_id)
        self.tools.show("replayed", [{"entity": ref, "events": sent, "to": settings.topics[0]}])

    def review(self, ref: str, confirm: bool, by: str) -> None:
        """Confirm the stopped step took effect (advance past it) or retry it; then drain."""
        applier, entity_id = self.entity(ref)
        conn = self.tools.conn
        decision = "confirmed" if confirm else "retried"
        since = applier.store.stopped_since(conn, entity_id)
        about = {"inorder.entity": ref, "inorder.decision": decision}
        # The review span: from the stop to the person's decision and the drain after it
        # (the stopped event, applied there, links to it).
        with tracing.span("review", "internal", about, began=since) as span:
            with conn.transaction():
                generation, last, stopped = self.progress_row(applier, entity_id)
                if stopped is None:
                    raise AdminError(f"{ref} is not waiting for a review")
                if confirm and stopped != last + 1:
                    raise AdminError(f"{ref} stopped at {stopped} but has applied only {last}")
                if confirm:
                    applier.store.confirm(conn, entity_id, generation, stopped, by)
                applier.store.resume(conn, entity_id, generation, stopped)
            if span is not None:
                span.set_attribute("inorder.seq", stopped)
            self._drain(applier, entity_id)
        self.tools.show(
            "reviewed", [{"entity": ref, "seq": stopped, "decision": decision, "by": by}]
        )

    def _drain(self, applier: StepApplier, entity_id: str) -> None:
        """Apply whatever became due for the entity, and count it as the consumer would."""
        applier.connect(Links.of(self.tools))
        drain(self.tools, applier, [entity_id])


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
