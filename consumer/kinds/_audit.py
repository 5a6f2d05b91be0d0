"""The audit: the outbox (the producer's truth) against what the consumer made of it.

Each route kind's inspector compares its own tables with the outbox (a projection
row must hold its entity's newest event, a step log every seq once); this module
gives them the means: both sides streamed with server-side cursors in byte order of
the entity id and merged entity by entity, so memory stays bounded, and one report.
Each divergence gets its likely cause; only unexplained ones make the audit fail. A
route whose kind has no inspector is listed as not audited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count, groupby
from typing import Any, Protocol

import psycopg
from psycopg import sql

Conn = psycopg.Connection[Any]
Rows = Iterator[tuple[Any, ...]]
# An entity id with its rows from each side.
Paired = Iterator[tuple[str, list[tuple[Any, ...]], list[tuple[Any, ...]]]]
_names = count()


class Audited(Protocol):
    """A route as the audit reads it: its stream and its kind's name."""

    @property
    def stream(self) -> str:
        """The route's own entity stream."""

    @property
    def kind(self) -> str:
        """The name of the route's kind."""


class Auditor(Protocol):
    """What the audit asks of a kind's inspector."""

    def audit(self, audit: Audit, route: Any) -> None:
        """Compare the route's tables with the outbox, adding divergences to ``audit``."""


class AuditedKind(Protocol):
    """A kind as the audit reads it: its inspector, if it has one."""

    @property
    def inspector(self) -> Auditor | None:
        """The kind's inspector (None: its routes are listed as not audited)."""


# inorder's own outbox, with ``unsent`` (a row its relay has not published).
INORDER_ROWS = sql.SQL(
    "SELECT o.id::text AS id, o.entity_type, o.entity_id, o.generation, o.seq, o.event_type, "
    "o.event_id, o.payload, o.headers, o.created_at, o.failure_reason, "
    "NOT outbox_published(o) AS unsent FROM outbox o"
)
# inorder's own outbox alone as the relation ``outbox`` (what a program without settings
# reads, and the tests' Audit); ``inorder-admin`` names its own (``consumer.admin.sources``).
INORDER_OUTBOX = sql.SQL("({}) AS outbox").format(INORDER_ROWS)


@dataclass(frozen=True, slots=True)
class Divergence:
    """One place where the consumer's state differs from the outbox."""

    route: str
    entity_id: str
    detail: str
    cause: str | None  # None: unexplained


@dataclass(slots=True)
class Report:
    """What the audit found."""

    entities: int = 0
    rows: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    # Streams whose kind cannot be audited (it has no inspector).
    not_audited: list[str] = field(default_factory=list)
    # Entities whose state came from a snapshot (``route:entity``), consistent with it.
    healed_by_snapshot: list[str] = field(default_factory=list)

    @property
    def unexplained(self) -> list[Divergence]:
        """Divergences no known state accounts for."""
        return [d for d in self.divergences if d.cause is None]


def merge(left: Rows, right: Rows) -> Paired:
    """Group two entity-ordered row streams by entity id (column 0) and pair the groups."""
    lgroups = ((k, list(g)) for k, g in groupby(left, key=lambda r: r[0]))
    rgroups = ((k, list(g)) for k, g in groupby(right, key=lambda r: r[0]))
    lnext, rnext = next(lgroups, None), next(rgroups, None)
    while lnext is not None or rnext is not None:
        lkey = lnext[0] if lnext else None
        rkey = rnext[0] if rnext else None
        if rkey is None or (lkey is not None and lkey.encode() < rkey.encode()):
            yield lkey, lnext[1], []  # type: ignore[misc, index]
            lnext = next(lgroups, None)
        elif lkey is None or rkey.encode() < lkey.encode():
            yield rkey, [], rnext[1]  # type: ignore[index]
            rnext = next(rgroups, None)
        else:
            yield lkey, lnext[1], rnext[1]  # type: ignore[index]
            lnext, rnext = next(lgroups, None), next(rgroups, None)


class Audit:
    """Runs the kinds' checks over one outbox connection and one consumer connection."""

    def __init__(
        self,
        outbox: Conn,
        consumer: Conn,
        kinds: Mapping[str, AuditedKind],
        tick: Callable[[], None] = lambda: None,
        only: str | None = None,
        source: sql.Composable = INORDER_OUTBOX,
    ) -> None:
        self.outbox = outbox
        # The outbox's rows as a relation named ``outbox``.
        self.source = source
        self.consumer = consumer
        self.tick = tick
        # One entity id to audit (inorder-admin explain), or None for every entity.
        self.only = only
        self.kinds = kinds
        self.report = Report()

    def run(self, routes: Sequence[Audited]) -> Report:
        """Audit every route, each side read in one transaction (server-side cursors)."""
        with self.outbox.transaction(), self.consumer.transaction():
            for route in routes:
                inspector = self.kinds[route.kind].inspector
                if inspector is None:
                    self.report.not_audited.append(route.stream)
                else:
                    inspector.audit(self, route)
        return self.report

    def stream(self, side: Conn, query: sql.SQL | sql.Composed, params: Sequence[Any]) -> Rows:
        """Rows of one side's query, read with a server-side cursor."""
        with side.cursor(name=f"audit_{next(_names)}") as cur:
            cur.itersize = 2000
            cur.execute(query, params)
            yield from cur

    def entity_pairs(self, sent: Rows, stored: Rows) -> Paired:
        """The outbox's and the consumer's rows merged by entity, each pair counted."""
        for entity, left, right in merge(sent, stored):
            self.report.entities += 1
            self.report.rows += len(left) + len(right)
            self.tick()
            yield entity, left, right

    def healed(self, route: str, entity: str) -> None:
        """Note an entity whose consistent state came from a snapshot."""
        self.report.healed_by_snapshot.append(f"{route}:{entity}")

    def diverge(self, route: str, entity: str, detail: str, cause: str | None) -> None:
        """Record one divergence (``cause`` None: unexplained)."""
        self.report.divergences.append(Divergence(route, entity, detail, cause))

    def entities(self, routes: Sequence[Audited]) -> int:
        """How many entities the audit will go through (for a progress bar)."""
        streams = [r.stream for r in routes]
        row = self.outbox.execute(
            sql.SQL(
                "SELECT count(DISTINCT (entity_type, entity_id)) FROM {} "
                "WHERE entity_type = ANY(%s)"
            ).format(self.source),
            (streams,),
        ).fetchone()
        return int(row[0]) if row else 0

    def dead_letter(self, stream: str, entity: str, generation: int, seq: int) -> str | None:
        """``dead-lettered: REASON`` (and the letter's status once a person acted) or None."""
        row = self.consumer.execute(
            "SELECT reason, status FROM inorder_dead_letters WHERE entity_type = %s "
            "AND entity_id = %s AND generation = %s AND seq = %s ORDER BY id DESC LIMIT 1",
            (stream, entity, generation, seq),
        ).fetchone()
        if row is None:
            return None
        return f"dead-lettered: {row[0]}" + ("" if row[1] == "new" else f" ({row[1]})")
