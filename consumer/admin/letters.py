"""``inorder-admin dead-letters``: list, show, replay and discard what the consumer refused.

Every letter of an event has a row (``inorder_dead_letters``) naming why, where the
original was and where its copy is. A replay sends the copy back to the original's topic
(or asks the relay to re-send the outbox row), at most once per letter: letters are
taken (``replaying``) in a transaction, sent, flushed, then marked ``replayed`` with who
and why. A replay cut short leaves its letters ``replaying`` and the next one resumes
them; a copy sent twice that way is harmless, since routes order by version and count
the second one stale.
"""

from __future__ import annotations

import argparse
import getpass
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from confluent_kafka import Message
from psycopg import sql
from psycopg.rows import dict_row

from consumer.admin import copies
from consumer.admin.replay import Chosen, Decision, Letter, Source, Status, choose, replayed_headers
from consumer.errors import AdminError
from consumer.kinds._plugin import AdminTools
from schemas.republish import RepublishRequest, encode
from schemas.runtime import kafka_watch

# Letters taken per transaction by a replay.
CHUNK = 200
LOST_COPY = "its copy is no longer in the dead-letter topic: replay it with --from-outbox"
OTHER_COPY = (
    "its place in the dead-letter topic holds another message (the topic recreated?): "
    "replay it with --from-outbox"
)
_FIELDS = (
    "id, entity_type, entity_id, generation, seq, event_id, reason, topic, letter_topic, "
    "letter_partition, letter_offset, cut, replays, kafka_partition, kafka_offset"
)


def add(sub: Any) -> None:
    """The ``dead-letters`` commands in inorder-admin's command line."""
    group = sub.add_parser("dead-letters", help="what the consumer refused").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    listing = group.add_parser("list", help="letters, newest first")
    _filters(listing)
    listing.add_argument("--limit", type=int, default=50, help="most rows (default 50)")
    group.add_parser(
        "show", help="every field of one letter, and the decisions on it"
    ).add_argument("id", type=int, metavar="ID", help="the letter's id")
    for action, what in (
        (
            "replay",
            "send letters back: each copy to its original topic (or, --from-outbox, the "
            "outbox row through the relay), at most once per letter; resumes one cut short",
        ),
        ("discard", "mark letters as never to be replayed"),
    ):
        cmd = group.add_parser(action, help=what)
        cmd.add_argument("ids", type=int, nargs="*", metavar="ID", help="these letters only")
        _filters(cmd)
        if action == "replay":
            cmd.add_argument(
                "--from-outbox",
                action="store_true",
                help="ask the relay for the original rows instead of sending the copies (the "
                "only way for a copy cut to size)",
            )
        cmd.add_argument(
            "--all",
            action="store_true",
            help="every open letter: needed when no ID and no filter names the letters",
        )
        cmd.add_argument("--dry-run", action="store_true", help="show what would be done, only")
        cmd.add_argument("--why", required=True, help="why (required, not empty)")
        cmd.add_argument("--by", default=getpass.getuser(), help="who decides (default: you)")


def _filters(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--reason", help="only letters with this reason code (unknown_stream, ...)")
    cmd.add_argument("--stream", help="only letters of this stream")
    cmd.add_argument("--entity", help="only letters of this entity id")
    cmd.add_argument("--type", dest="event_type", help="only letters of this event type")
    cmd.add_argument("--since", type=datetime.fromisoformat, help="recorded at or after (ISO)")
    cmd.add_argument("--until", type=datetime.fromisoformat, help="recorded before (ISO)")
    cmd.add_argument("--status", choices=list(Status), help="only letters in this status")


def run(args: argparse.Namespace, tools: AdminTools) -> None:
    """Run one parsed ``dead-letters`` command."""
    letters = Letters(tools)
    match args.action:
        case "list":
            letters.listing(args, args.limit)
        case "show":
            letters.show(args.id)
        case "replay":
            letters.replay(args, from_outbox=args.from_outbox)
        case "discard":
            letters.discard(args)


def where(args: argparse.Namespace, *, open_only: bool) -> sql.Composed:
    """The WHERE clause of the filters given (``open_only``: new or interrupted letters)."""
    parts: list[sql.Composable] = [sql.SQL("true")]
    columns = {
        "reason": "reason",
        "stream": "entity_type",
        "entity": "entity_id",
        "event_type": "event_type",
        "status": "status",
    }
    for name, column in columns.items():
        value = getattr(args, name, None)
        if value is not None:
            parts.append(sql.SQL("{} = {}").format(sql.Identifier(column), sql.Literal(value)))
    if getattr(args, "since", None) is not None:
        parts.append(sql.SQL("recorded_at >= {}").format(sql.Literal(args.since)))
    if getattr(args, "until", None) is not None:
        parts.append(sql.SQL("recorded_at < {}").format(sql.Literal(args.until)))
    ids = getattr(args, "ids", None)
    if ids:
        parts.append(sql.SQL("id = ANY({})").format(sql.Literal(list(ids))))
    if open_only:
        parts.append(sql.SQL("status IN ('new', 'replaying')"))
    return sql.SQL(" AND ").join(parts)


class Letters:
    """The commands over the program's tools."""

    def __init__(self, tools: AdminTools) -> None:
        self.tools = tools

    def listing(self, args: argparse.Namespace, limit: int) -> None:
        """Letters matching the filters, newest first."""
        query = sql.SQL(
            "SELECT id, entity_type AS stream, entity_id AS entity, generation, seq, "
            "event_type, reason, status, replays, cut, recorded_at FROM inorder_dead_letters "
            "WHERE {} ORDER BY id DESC LIMIT {}"
        ).format(where(args, open_only=False), sql.Literal(limit))
        with self.tools.conn.cursor(row_factory=dict_row) as cur:
            self.tools.show("dead letters", cur.execute(query).fetchall())

    def show(self, letter_id: int) -> None:
        """One letter, every field, and every decision on it."""
        with self.tools.conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                "SELECT * FROM inorder_dead_letters WHERE id = %s", (letter_id,)
            ).fetchone()
            if row is None:
                raise AdminError(f"there is no dead letter {letter_id}")
            decisions = cur.execute(
                "SELECT decision, source, done_by, reason, done_at "
                "FROM inorder_dead_letter_decisions WHERE letter_id = %s ORDER BY done_at",
                (letter_id,),
            ).fetchall()
        self.tools.show(f"dead letter {letter_id}", [row])
        if decisions:
            self.tools.show("decisions", decisions)

    def replay(self, args: argparse.Namespace, *, from_outbox: bool) -> None:
        """Send the matching open letters back, chunk by chunk; what was done and refused."""
        _why(args)
        if args.dry_run:
            chosen = choose(self._open(args, lock=False), from_outbox=from_outbox)
            self.tools.show("would replay", [_row(c) for c in chosen])
            return
        done: list[dict[str, Any]] = []
        refused: set[int] = set()
        # Only letters there before it started: a replayed event refused again comes back
        # as a new letter, which this replay must not chase.
        row = self.tools.conn.execute("SELECT max(id) FROM inorder_dead_letters").fetchone()
        through = row[0] if row and row[0] is not None else 0
        while taking := self._take(args, through, refused, done, from_outbox=from_outbox):
            copied = [c.letter for c in taking if c.source is Source.COPY]
            found, strangers = copies.read(self.tools, copied)
            lost = [c for c in taking if c.source is Source.COPY and c.letter.id not in found]
            if lost:  # back to new: the copy is gone, or its place holds another message
                with self.tools.conn.transaction():
                    self._mark(lost, Status.NEW)
                refused |= {c.letter.id for c in lost}
                done += [
                    _row(replace(c, refused=OTHER_COPY if c.letter.id in strangers else LOST_COPY))
                    for c in lost
                ]
                taking = [c for c in taking if c not in lost]
            self._send(taking, found)
            with self.tools.conn.transaction():
                self._mark(taking, Status.REPLAYED)
                self._decide(taking, Decision.REPLAYED, args)
            done += [_row(c) for c in taking]
        self.tools.show("replayed" if done else "nothing to replay", done)
        if refused:
            raise AdminError(f"{len(refused)} letter(s) not replayed; see why in the table above")

    def _take(
        self,
        args: argparse.Namespace,
        through: int,
        refused: set[int],
        done: list[dict[str, Any]],
        *,
        from_outbox: bool,
    ) -> list[Chosen]:
        """Take the next chunk of open letters (marked ``replaying``); refusals go to ``done``."""
        with self.tools.conn.transaction():
            found = self._open(args, lock=True, skip=refused, through=through)
            chosen = choose(found, from_outbox=from_outbox)
            taking = [c for c in chosen if c.refused is None]
            self._mark(taking, Status.REPLAYING)
        refused |= {c.letter.id for c in chosen if c.refused is not None}
        done += [_row(c) for c in chosen if c.refused is not None]
        return taking

    def discard(self, args: argparse.Namespace) -> None:
        """Mark the matching open letters as never to be replayed."""
        _why(args)
        letters = self._open(args, lock=False)
        if args.dry_run:
            self.tools.show("would discard", [{"id": x.id, "reason": x.reason} for x in letters])
            return
        taken = [Chosen(x, Source.COPY) for x in letters]
        with self.tools.conn.transaction():
            self._mark(taken, Status.DISCARDED)
            self._decide(taken, Decision.DISCARDED, args, source=False)
        self.tools.show("discarded", [{"id": x.id, "reason": x.reason} for x in letters])

    # ------------------------------------------------------------------ reading and writing

    def _open(
        self,
        args: argparse.Namespace,
        *,
        lock: bool,
        skip: set[int] | None = None,
        through: int | None = None,
    ) -> list[Letter]:
        """Open letters matching the filters, oldest first (``lock``: a chunk, taken).

        ``skip``: ids already refused; ``through``: the newest id to take.
        """
        clause = where(args, open_only=True)
        if through is not None:
            clause = sql.SQL("{} AND id <= {}").format(clause, sql.Literal(through))
        if skip:
            clause = sql.SQL("{} AND NOT id = ANY({})").format(clause, sql.Literal(sorted(skip)))
        query = sql.SQL("SELECT {} FROM inorder_dead_letters WHERE {} ORDER BY id").format(
            sql.SQL(_FIELDS), clause
        )
        if lock:
            query = sql.SQL("{} LIMIT {} FOR UPDATE SKIP LOCKED").format(query, sql.Literal(CHUNK))
        return [Letter(*row) for row in self.tools.conn.execute(query).fetchall()]

    def _mark(self, chosen: Sequence[Chosen], status: Status) -> None:
        if chosen:
            self.tools.conn.execute(
                "UPDATE inorder_dead_letters SET status = %s WHERE id = ANY(%s)",
                (str(status), [c.letter.id for c in chosen]),
            )

    def _decide(
        self,
        chosen: Sequence[Chosen],
        decision: Decision,
        args: argparse.Namespace,
        *,
        source: bool = True,
    ) -> None:
        """Record the decision on each letter, with who and why."""
        with self.tools.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO inorder_dead_letter_decisions (letter_id, decision, source, "
                "done_by, reason) VALUES (%s, %s, %s, %s, %s)",
                [
                    (
                        c.letter.id,
                        str(decision),
                        str(c.source) if source else None,
                        args.by,
                        args.why,
                    )
                    for c in chosen
                ],
            )

    def _send(self, chosen: Sequence[Chosen], found: dict[int, Message]) -> None:
        """Produce every chosen letter's event (or its republish request), then flush."""
        settings, producer = self.tools.settings, self.tools.producer
        for c in chosen:
            letter = c.letter
            if c.source is Source.OUTBOX:
                request = RepublishRequest(
                    f"dead-letter-{letter.id}-{uuid.uuid4().hex[:6]}",
                    letter.entity_type,
                    letter.entity_id,
                    letter.generation,
                    letter.seq,
                    letter.seq,
                    f"dead letter {letter.id} replayed from the outbox",
                )
                producer.produce(settings.republish_requests_topic, encode(request), request.key)
                continue
            copy = found[letter.id]
            pairs: Any = copy.headers() or []
            producer.produce(
                letter.topic or settings.topics[0],
                copy.value(),
                copy.key(),
                headers=replayed_headers(pairs, letter.replays),
            )
        why = kafka_watch.unsent(producer, 30)
        if why:
            raise AdminError(
                f"not every replayed event was sent: {why}; run the same replay again to finish"
            )


# What names the letters a replay or a discard acts on, besides ``--all``.
_NAMING = ("ids", "reason", "stream", "entity", "event_type", "since", "until", "status")


def _why(args: argparse.Namespace) -> None:
    """Refuse a decision without a reason, or one that names no letter (unless ``--all``)."""
    if not args.why.strip():
        raise AdminError("--why must say why these letters are replayed or discarded")
    named = any(getattr(args, name, None) for name in _NAMING)
    if not (named or args.all or args.dry_run):
        raise AdminError(
            f"name the letters to {args.action}: IDs or a filter (--reason, --stream, --entity, "
            "--type, --since, --until, --status), or --all for every open letter"
        )


def _row(chosen: Chosen) -> dict[str, Any]:
    letter = chosen.letter
    return {
        "id": letter.id,
        "entity": f"{letter.entity_type}:{letter.entity_id}",
        "seq": letter.seq,
        "reason": letter.reason,
        "from": str(chosen.source),
        "refused": chosen.refused,
    }
