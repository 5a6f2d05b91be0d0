"""Events held for a person (an entity's parking set was full), as ``held replay`` takes them.

The consumer writes a held event's copy to the held topic and records where it went
(``deadletter.post``). ``held replay`` sends back only what is recorded, read at its
offset and checked against its event id, each once; whatever else the held topic holds
is never replayed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row

Conn = psycopg.Connection[Any]


@dataclass(frozen=True, slots=True)
class Held:
    """One held event's record."""

    id: int
    entity_id: str
    seq: int
    event_id: str
    held_topic: str
    held_partition: int
    held_offset: int


def claim(conn: Conn, route: str, entity_id: str) -> list[Held]:
    """The entity's held events not yet replayed, marked as being replayed, oldest first."""
    with conn.cursor(row_factory=class_row(Held)) as cur:
        claimed = cur.execute(
            "UPDATE inorder_held_events SET status = 'replaying' "
            "WHERE route = %s AND entity_id = %s AND status <> 'replayed' "
            "RETURNING id, entity_id, seq, event_id, held_topic, held_partition, held_offset",
            (route, entity_id),
        ).fetchall()
    return sorted(claimed, key=lambda held: held.id)


def replayed(conn: Conn, ids: Sequence[int], by: str) -> None:
    """Mark these held events replayed, by whom."""
    conn.execute(
        "UPDATE inorder_held_events SET status = 'replayed', replayed_at = now(), "
        "replayed_by = %s WHERE id = ANY(%s)",
        (by, list(ids)),
    )


def by_partition(claimed: Sequence[Held]) -> dict[tuple[str, int], dict[int, Held]]:
    """The claimed events by (topic, partition), then by offset: what to read, and where."""
    found: dict[tuple[str, int], dict[int, Held]] = {}
    for held in claimed:
        found.setdefault((held.held_topic, held.held_partition), {})[held.held_offset] = held
    return found
