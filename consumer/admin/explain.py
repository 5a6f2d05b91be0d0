"""``inorder-admin explain``: one entity's whole story, from its outbox rows to what was applied.

Everything is read, nothing is changed: the outbox rows with whether each was sent or
failed, what the route's kind holds (its inspector: a projection's row, a step route's
progress, log, gaps and parks), the entity's dead letters, and the audit run on this
entity alone. ``verdict`` turns that into one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from consumer.kinds import Findings, Kind, Resources, Route
from consumer.kinds._audit import INORDER_OUTBOX, Audit, Divergence
from schemas.snapshot import snapshot_type

if TYPE_CHECKING:
    from consumer.settings import SweeperSettings

Conn = psycopg.Connection[Any]
# More outbox rows than this are summarised by their count (the newest are shown).
MAX_OUTBOX_ROWS = 200


@dataclass(slots=True)
class Story:
    """What is known about one entity: the outbox's side, the kind's, and the audit's verdict."""

    stream: str
    entity_id: str
    kind: str
    outbox_rows: int = 0
    outbox: list[dict[str, Any]] = field(default_factory=list)
    held: Findings = field(default_factory=Findings)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def known(self) -> bool:
        """Whether either side has ever heard of the entity."""
        return bool(self.outbox_rows or self.held.known)

    def as_dict(self) -> dict[str, Any]:
        """Every section, plus the verdict, for --json."""
        return {
            "stream": self.stream,
            "entity_id": self.entity_id,
            "kind": self.kind,
            "outbox_rows": self.outbox_rows,
            "outbox": self.outbox,
            "applied": self.held.applied,
            **{key: rows for key, (_, rows) in self.held.sections.items()},
            "parked": self.held.parked,
            "dead_letters": self.dead_letters,
            "divergences": [asdict(d) for d in self.divergences],
            "verdict": verdict(self),
        }


def verdict(story: Story) -> str:
    """One line: consistent, behind for a known reason, or diverging for none."""
    unexplained = [d for d in story.divergences if d.cause is None]
    if unexplained:
        return "diverges, unexplained: " + "; ".join(d.detail for d in unexplained)
    if story.divergences:
        causes = dict.fromkeys(f"{d.detail} ({d.cause})" for d in story.divergences)
        return "behind, explained: " + "; ".join(causes)
    consistent = "consistent with the outbox" + _healed(story)
    if story.held.parked:
        return f"{consistent}; {len(story.held.parked)} event(s) parked"
    return consistent


def _healed(story: Story) -> str:
    """`` (healed by snapshot at G/S)`` when the outbox's newest version is a lone snapshot."""
    if not story.outbox:
        return ""
    newest = max((r["generation"], r["seq"]) for r in story.outbox)
    at = [r for r in story.outbox if (r["generation"], r["seq"]) == newest]
    if {r["event_type"] for r in at} != {snapshot_type(story.stream)}:
        return ""
    return f" (healed by snapshot at {newest[0]}/{newest[1]})"


def _outbox(outbox: Conn, story: Story, source: sql.Composable) -> None:
    with outbox.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            sql.SQL(
                "SELECT count(*) OVER () AS total, id, generation, seq, event_type, created_at, "
                "NOT unsent AS sent, failure_reason AS failed, "
                # The trace the row was written in (emit's traceparent), to look it up by.
                "nullif(split_part(headers->>'traceparent', '-', 2), '') AS trace_id "
                "FROM {} WHERE entity_type = %s AND entity_id = %s "
                "ORDER BY generation DESC, seq DESC, id DESC LIMIT %s"
            ).format(source),
            (story.stream, story.entity_id, MAX_OUTBOX_ROWS),
        ).fetchall()
    story.outbox_rows = int(rows[0]["total"]) if rows else 0
    for row in rows:
        del row["total"]
    story.outbox = rows[::-1]


def gather(
    route: Route,
    entity_id: str,
    outbox: Conn,
    tools: Resources[SweeperSettings],
    kinds: Mapping[str, Kind],
    source: sql.Composable = INORDER_OUTBOX,
) -> Story:
    """Read every section of one entity's story (read-only, one statement per section).

    ``source``: the outbox's rows as a relation named ``outbox`` (``sources``).
    """
    story = Story(route.stream, entity_id, route.kind)
    _outbox(outbox, story, source)
    inspector = kinds[route.kind].inspector
    if inspector is not None:
        story.held = inspector.story(tools, route, entity_id)
    with tools.conn.cursor(row_factory=dict_row) as cur:
        story.dead_letters = cur.execute(
            "SELECT d.id, d.generation, d.seq, d.reason, d.detail, d.recorded_at, d.status, "
            "d.replays, (SELECT string_agg(x.decision || coalesce(' from ' || x.source, '') "
            "  || ' by ' || x.done_by || ' at ' || to_char(x.done_at, 'YYYY-MM-DD HH24:MI:SS') "
            "  || ': ' || x.reason, '; ' ORDER BY x.done_at) "
            " FROM inorder_dead_letter_decisions x WHERE x.letter_id = d.id) AS decisions "
            "FROM inorder_dead_letters d WHERE d.entity_type = %s AND d.entity_id = %s "
            "ORDER BY d.recorded_at",
            (route.stream, entity_id),
        ).fetchall()
    audit = Audit(outbox, tools.conn, kinds, only=entity_id, source=source)
    story.divergences = audit.run([route]).divergences
    return story
