"""The consumer side of the example subscription service (``producer.subscriptions``).

Subscriptions carry their full state, so a projection keeps the newest (``BILLING_VIEW``,
``PROJECTION_ROUTE``). Seats arrive as deltas, so every ``seat_ledger`` event must be
applied once and in order: a step route (``STEP_ROUTE``, the functions below,
``SEAT_TABLES``). The demo and the tests use these.
"""

from __future__ import annotations

from typing import Any

import psycopg

from schemas import Event

# seen_at is when a subscription's row first appeared (a column the route does not write).
BILLING_VIEW = """
CREATE TABLE IF NOT EXISTS billing_view (
    subscription_id text        PRIMARY KEY,
    generation      bigint      NOT NULL,
    seq             bigint      NOT NULL,
    plan            text,
    price_cents     integer,
    status          text,
    seen_at         timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

PROJECTION_ROUTE = """
[[route]]
stream = "subscription"
kind = "projection"
table = "billing_view"
key = "subscription_id"
[route.columns]
plan = "plan"
price_cents = "price_cents"
status = "status"
"""

STEP_ROUTE = """
[[route]]
stream = "seat_ledger"
kind = "step"
[route.handlers]
"seat_ledger.opened" = "consumer.examples:open_ledger"
"seat_ledger.seats_added" = "consumer.examples:add_seats"
"""

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
