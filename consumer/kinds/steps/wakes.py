"""Entities a person's decision left with steps to apply, for the sweeper to drain.

``inorder-admin skip`` and ``review`` record their decision and a wake in one
transaction; the sweeper drains each woken entity with the handlers deployed beside the
consumers, so an operator's machine never runs a handler (or an external call) unless
the command is given ``--run-handlers``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

Conn = psycopg.Connection[Any]


def ask(conn: Conn, route: str, entity_id: str, decision: str, by: str) -> None:
    """Ask the sweeper to drain the entity (once; a newer ask replaces an older one)."""
    conn.execute(
        "INSERT INTO inorder_step_wakes (route, entity_id, decision, asked_by) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (route, entity_id) DO UPDATE SET "
        "decision = excluded.decision, asked_by = excluded.asked_by, "
        "asked_at = excluded.asked_at",
        (route, entity_id, decision, by),
    )


def due(conn: Conn, route: str, most: int) -> list[tuple[str, datetime]]:
    """The route's woken entities, oldest ask first, with when each was asked."""
    with conn.transaction():
        rows = conn.execute(
            "SELECT entity_id, asked_at FROM inorder_step_wakes WHERE route = %s "
            "ORDER BY asked_at LIMIT %s",
            (route, most),
        ).fetchall()
    return [(str(entity_id), asked_at) for entity_id, asked_at in rows]


def done(conn: Conn, route: str, entity_id: str, asked_at: datetime) -> None:
    """Forget the ask that was served (a newer one, made meanwhile, stays)."""
    with conn.transaction():
        conn.execute(
            "DELETE FROM inorder_step_wakes WHERE route = %s AND entity_id = %s AND asked_at = %s",
            (route, entity_id, asked_at),
        )
