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

from confluent_kafka import Message, TopicPartition

from consumer.errors import AdminError
from consumer.kinds._plugin import AdminTools, Commands
from consumer.kinds.steps import gaps, wakes
from consumer.kinds.steps import held as holding
from consumer.kinds.steps.drain import drain
from consumer.kinds.steps.gaps import GapStatus
from consumer.kinds.steps.parking import lot_of
from consumer.kinds.steps.route import StepRoute
from consumer.kinds.steps.runner import StepApplier
from consumer.kinds.steps.store import HELD, NEEDS_REVIEW, RETRYING, StepStore
from schemas import DecodeError, headers, tracing
from schemas.runtime import kafka_clients, kafka_watch
from schemas.runtime.reading import Reading

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
    _runs_handlers(skip)
    held = sub.add_parser("held", help="entities whose parking set was full").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    held.add_parser("list", help="held entities")
    replay = held.add_parser(
        "replay",
        help="send the entity's held events back, each to the topic it came in, as the "
        "consumer recorded them (each once), and release it",
    )
    replay.add_argument("entity", metavar="STREAM:ENTITY", help=ENTITY)
    replay.add_argument("--by", default=getpass.getuser(), help="who decides (default: you)")
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
        _runs_handlers(cmd)


def _runs_handlers(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--run-handlers",
        action="store_true",
        help="apply what the decision lets through here, importing and running the route's "
        "handlers (external calls included) on this machine; default: record the decision "
        "and let the sweeper apply it beside the consumers",
    )


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
            steps.skip(args.entity, args.through, args.reason, args.by, args.run_handlers)
        case ("held", "list"):
            tools.rows("held", HELD)
        case ("held", "replay"):
            steps.held_replay(args.entity, args.by)
        case ("review", "list"):
            tools.rows("needs review", NEEDS_REVIEW)
        case ("review", "retrying"):
            tools.rows("retrying", RETRYING)
        case ("review", action):
            steps.review(args.entity, action == "confirm", args.by, args.run_handlers)


COMMANDS = Commands(("gaps", "parked", "skip", "held", "review"), add, run)


class StepCommands:
    """The step commands over the program's tools and the routes file's step routes."""

    def __init__(self, tools: AdminTools, routes: Sequence[StepRoute]) -> None:
        self.tools = tools
        self.steps = {r.stream: r for r in routes}

    def entity(self, ref: str) -> tuple[StepStore, str]:
        """Split ``stream:entity_id`` of a step route: its store (no handler imported)."""
        route, entity_id = self.tools.routed(ref)
        if route.stream not in self.steps:
            raise AdminError(f"{route.stream!r} is a {route.kind} route; this command is for steps")
        store = StepStore(self.steps[route.stream])
        store.shared = True  # the consumers apply this entity's events meanwhile
        return store, entity_id

    def progress_row(self, store: StepStore, entity_id: str) -> tuple[int, int, int | None]:
        """Lock and return (generation, last_applied, stopped_at_seq) of a known entity."""
        row = store.locked(self.tools.conn, entity_id)
        if row is None:
            raise AdminError(
                f"{store.route.stream}:{entity_id} is unknown: no step progress recorded"
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

    def skip(self, ref: str, through: int, reason: str, by: str, run_handlers: bool) -> None:
        """A person's decision: the gap's seqs up to ``through`` will never come."""
        store, entity_id = self.entity(ref)
        stream = store.route.stream
        if not reason.strip():
            raise AdminError("--reason must say why these seqs are skipped")
        here = self._handlers(store) if run_handlers else None
        conn = self.tools.conn
        with conn.transaction():
            gap = gaps.find(conn, stream, entity_id)
            if gap is None:
                raise AdminError(f"{ref} has no open gap; nothing to skip")
            if not gap.from_seq <= through <= gap.to_seq:
                raise AdminError(
                    f"--through {through} is outside {ref}'s open gap {gap.from_seq}..{gap.to_seq}"
                )
            generation, last, _ = self.progress_row(store, entity_id)
            if (generation, last) != (gap.generation, gap.from_seq - 1):
                raise AdminError(f"{ref} moved since the gap was recorded; list the gaps again")
            store.skip(conn, entity_id, (generation, gap.from_seq, through), by, reason)
            if through == gap.to_seq:
                if not gaps.resolve(conn, gap, GapStatus.SKIPPED, by, reason):
                    raise AdminError(f"{ref}'s gap changed meanwhile; list the gaps again")
            else:
                gaps.narrow(conn, gap, through + 1)
            if here is None:
                wakes.ask(conn, stream, entity_id, "skipped", by)
        applied = self._drain(here, entity_id)
        skipped = {
            "entity": ref,
            "generation": generation,
            "from_seq": gap.from_seq,
            "through": through,
            "by": by,
            "reason": reason,
            "then": applied,
        }
        self.tools.show("skipped", [skipped])

    def held_replay(self, ref: str, by: str) -> None:
        """Send the entity's recorded held events back to the topic each came in (a
        consumed topic, else the first events topic) and release it.

        Each copy is read at the offset the consumer recorded and checked against its
        stream, entity, event id and seq, so nothing another client wrote to the held
        topic goes back; each is replayed once (a replay cut short is taken up again by
        the next).
        """
        store, entity_id = self.entity(ref)
        conn, settings, producer = self.tools.conn, self.tools.settings, self.tools.producer
        claimed = holding.claim(conn, store.route.stream, entity_id)
        if not claimed:
            raise AdminError(
                f"{ref} has no held event recorded to replay (none held, all replayed, or held "
                f"before release 0.5.0); ask the outbox instead: inorder-admin republish {ref}"
            )
        reading = settings.reading()
        found = self._read_held(claimed, store.route.stream, entity_id, reading)
        sent_to: set[str] = set()
        for held in claimed:
            message = found.get(held.id)
            if message is not None:
                pairs: Any = message.headers() or []
                kept = [(k, v) for k, v in pairs if not headers.about_a_letter(k)]
                # Back where it came from, if the consumers read it (a Debezium topic is
                # read in Debezium's form), else to the first events topic.
                topic = _came_from(message)
                consumed = [*settings.topics, *reading.topics]
                topic = topic if topic in consumed else settings.topics[0]
                producer.produce(topic, message.value(), message.key(), headers=kept)
                sent_to.add(topic)
        why = kafka_watch.unsent(producer, 30)
        if why:
            raise AdminError(f"the replayed events were not sent: {why}; the entity stays held")
        holding.replayed(conn, [held.id for held in claimed if held.id in found], by)
        missing = [held.seq for held in claimed if held.id not in found]
        if not missing:
            store.release(conn, entity_id)
        to = ", ".join(sorted(sent_to)) or settings.topics[0]
        row = {"entity": ref, "events": len(found), "to": to, "by": by}
        self.tools.show("replayed", [row | ({"not_found": missing} if missing else {})])
        if missing:
            raise AdminError(
                f"{ref}: the held copies of seqs {missing} are no longer in the held topic "
                f"(retention?); the entity stays held: inorder-admin republish {ref}"
            )

    def _read_held(
        self, claimed: Sequence[holding.Held], stream: str, entity_id: str, reading: Reading
    ) -> dict[int, Message]:
        """The held topic's message at each claimed offset that is the event recorded there."""
        reader = kafka_clients.consumer(
            self.tools.settings, "inorder-admin", f"inorder-admin-{uuid.uuid4().hex[:8]}"
        )
        found: dict[int, Message] = {}
        try:
            for (topic, partition), wanted in holding.by_partition(claimed).items():
                low, high = reader.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
                there = [offset for offset in wanted if low <= offset < high]
                if not there:
                    continue  # past retention, or the topic was recreated
                reader.assign([TopicPartition(topic, partition, min(there))])
                deadline, position = time.monotonic() + 30, -1
                while position < max(there) and time.monotonic() < deadline:
                    for message in reader.consume(500, 1.0):
                        if message.error() is not None or message.partition() != partition:
                            continue
                        offset = message.offset()
                        if offset is None:
                            continue
                        position = max(position, offset)
                        held = wanted.get(offset)
                        if held is not None and _is(message, held, stream, entity_id, reading):
                            found[held.id] = message
        finally:
            reader.close()
        return found

    def review(self, ref: str, confirm: bool, by: str, run_handlers: bool) -> None:
        """Confirm the stopped step took effect (advance past it) or retry it; then drain
        (here with ``run_handlers``, else by the sweeper)."""
        store, entity_id = self.entity(ref)
        here = self._handlers(store) if run_handlers else None
        conn = self.tools.conn
        decision = "confirmed" if confirm else "retried"
        since = store.stopped_since(conn, entity_id)
        about = {"inorder.entity": ref, "inorder.decision": decision}
        # The review span: from the stop to the person's decision and the drain after it
        # (the stopped event, applied there, links to it).
        with tracing.span("review", "internal", about, began=since) as span:
            with conn.transaction():
                generation, last, stopped = self.progress_row(store, entity_id)
                if stopped is None:
                    raise AdminError(f"{ref} is not waiting for a review")
                if confirm and stopped != last + 1:
                    raise AdminError(f"{ref} stopped at {stopped} but has applied only {last}")
                if confirm:
                    store.confirm(conn, entity_id, generation, stopped, by)
                store.resume(conn, entity_id, generation, stopped)
                if here is None:
                    wakes.ask(conn, store.route.stream, entity_id, decision, by)
            if span is not None:
                span.set_attribute("inorder.seq", stopped)
            applied = self._drain(here, entity_id)
        row = {"entity": ref, "seq": stopped, "decision": decision, "by": by, "then": applied}
        self.tools.show("reviewed", [row])

    def _handlers(self, store: StepStore) -> StepApplier:
        """The route started here, its handlers imported (``--run-handlers``): before any
        decision is recorded, so a handler that cannot be imported decides nothing."""
        applier = StepApplier(store.route)
        applier.share()
        applier.connect(self.tools)
        return applier

    def _drain(self, here: StepApplier | None, entity_id: str) -> str:
        """Apply here whatever became due, counted as the consumer would, when the route
        was started here; else the sweeper will, beside the consumers."""
        if here is None:
            return "recorded; the sweeper applies what is due on its next pass"
        drain(self.tools, here, [entity_id])
        return "applied here (--run-handlers)"


def _came_from(message: Message) -> str | None:
    """The topic a held copy's event first came in, as its letter header says."""
    pairs: Any = message.headers() or []
    for name, value in pairs:
        if name == headers.DLQ_TOPIC and isinstance(value, bytes):
            return value.decode(errors="replace")
    return None


def _is(
    message: Message, held: holding.Held, stream: str, entity_id: str, reading: Reading
) -> bool:
    """Whether ``message`` is the held event recorded: its stream, entity, event id and seq."""
    try:
        # Read in the form of the topic it came in (Debezium's only on Debezium's topics).
        event, _ = reading.read(message, _came_from(message) or "")
    except DecodeError:
        return False
    return (event.entity_type, event.entity_id, event.event_id, event.seq) == (
        stream,
        entity_id,
        held.event_id,
        held.seq,
    )


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
