"""Forgetting the consumer's history past its retention, a bounded slice at a time.

What the consumer records as it goes (each step it applied, each call it finished, each
failure, each gap, each letter a person decided, each held copy sent back) grows without
end unless something deletes it. The active sweeper deletes rows older than
``INORDER_HISTORY_RETENTION_S``, at most ``most`` per table per pass, in the table's
order: rows are written in time order, so that is oldest first, and a pass reads the
old blocks it deletes from (through a block-range index) instead of sorting every old
row of a table that may hold millions.

What still matters is never deleted, whatever its age: a letter still open, a gap not
resolved, a call not finished, a failure whose step is not applied yet, a held copy not
sent back, and every entity's progress (without it a later event of the entity could
not be placed, and an old one would be applied again). A person's skips stay too: they
are few, and they are the record of a decision.
"""

from __future__ import annotations

from typing import Any

import psycopg

Conn = psycopg.Connection[Any]

# Table -> the rows that may go once older than the cutoff (%(cutoff)s), and the
# column their age is read from.
FORGETTABLE: dict[str, tuple[str, str]] = {
    "inorder_step_log": ("true", "applied_at"),
    "inorder_step_attempts": ("completed_at IS NOT NULL", "completed_at"),
    "inorder_step_failures": (
        "EXISTS (SELECT 1 FROM inorder_step_progress p WHERE p.route = t.route "
        "AND p.entity_id = t.entity_id AND (p.generation, p.last_applied) >= "
        "(t.generation, t.seq))",
        "failed_at",
    ),
    "inorder_gaps": ("resolved_at IS NOT NULL", "resolved_at"),
    "inorder_held_events": ("status = 'replayed'", "replayed_at"),
    "inorder_dead_letter_decisions": (
        "EXISTS (SELECT 1 FROM inorder_dead_letters l WHERE l.id = t.letter_id "
        "AND l.status IN ('replayed', 'discarded') AND l.recorded_at < %(cutoff)s)",
        "done_at",
    ),
    "inorder_dead_letters": (
        "status IN ('replayed', 'discarded') AND NOT EXISTS (SELECT 1 FROM "
        "inorder_dead_letter_decisions d WHERE d.letter_id = t.id)",
        "recorded_at",
    ),
}


def forget(conn: Conn, retention_s: float, most: int) -> dict[str, int]:
    """Delete up to ``most`` forgettable rows older than ``retention_s`` from each table;
    how many went from each. The cutoff is read once, on the database's clock; each table
    goes in a transaction of its own."""
    with conn.transaction():
        row = conn.execute("SELECT now() - make_interval(secs => %s)", (retention_s,)).fetchone()
    given = {"cutoff": row[0] if row else None, "most": most}
    gone: dict[str, int] = {}
    for table, (which, age) in FORGETTABLE.items():
        statement = (
            f"DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table} t "  # noqa: S608
            f"WHERE {age} < %(cutoff)s AND {which} LIMIT %(most)s)"
        )
        with conn.transaction():
            gone[table] = conn.execute(statement, given).rowcount
    return gone
