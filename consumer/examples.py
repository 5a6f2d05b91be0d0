"""Step functions for the example subscription service (``producer.subscriptions``).

Seats arrive as deltas, so every ``seat_ledger`` event must be applied once and in order:
a step route. ``SEAT_TABLES`` is their DDL; the demo and tests create it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from schemas import Event

SEAT_TABLES = """
CREATE TABLE IF NOT EXISTS seat_totals (
    subscription_id text PRIMARY KEY,
    generation      bigint  NOT NULL,
    seats           integer NOT NULL
);
"""


def open_ledger(conn: psycopg.Connection[Any], event: Event) -> None:
    """A ledger opens (or re-opens in a new generation) with its starting seats."""
    conn.execute(
        "INSERT INTO seat_totals (subscription_id, generation, seats) VALUES (%s, %s, %s) "
        "ON CONFLICT (subscription_id) DO UPDATE SET generation = EXCLUDED.generation, "
        "seats = EXCLUDED.seats",
        (event.entity_id, event.generation, event.payload["seats"]),
    )


def add_seats(conn: psycopg.Connection[Any], event: Event) -> None:
    """Add the event's delta; applied in order, the total always equals the producer's."""
    conn.execute(
        "UPDATE seat_totals SET seats = seats + %s WHERE subscription_id = %s AND generation = %s",
        (event.payload["count"], event.entity_id, event.generation),
    )
