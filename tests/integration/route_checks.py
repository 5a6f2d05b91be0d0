"""Handlers and events for testing ``consumer.testing``: the example service, and a feed whose
handler appends without looking at seq (so it depends on the order entities arrive in)."""

from __future__ import annotations

from typing import Any

import psycopg

from consumer import examples
from consumer.testing import event
from schemas import Event

EXAMPLE_ROUTES = examples.PROJECTION_ROUTE + examples.STEP_ROUTE
# seen_at records when a row first appeared: it differs between runs by design.
EXAMPLE_TABLES: dict[str, list[str] | None] = {
    "billing_view": ["subscription_id", "generation", "seq", "plan", "price_cents", "status"],
    "seat_totals": None,
}
FEED_ROUTES = """
[[route]]
stream = "post"
kind = "step"
[route.handlers]
"post.published" = "tests.integration.route_checks:append_to_feed"
"""
FEED_TABLE = "CREATE TABLE feed (id int PRIMARY KEY, items text[] NOT NULL)"


def create_example_tables(conn: psycopg.Connection[Any]) -> None:
    """The example service's consumer-side tables."""
    conn.execute(examples.BILLING_VIEW)
    conn.execute(examples.SEAT_TABLES)


def create_feed(conn: psycopg.Connection[Any]) -> None:
    """The feed table the order-sensitive handler writes."""
    conn.execute(FEED_TABLE)


def append_to_feed(conn: psycopg.Connection[Any], post: Event) -> None:
    """Append the post to one shared feed: right per entity, wrong across entities."""
    conn.execute(
        "INSERT INTO feed VALUES (1, ARRAY[%s]) "
        "ON CONFLICT (id) DO UPDATE SET items = feed.items || EXCLUDED.items",
        (f"{post.entity_id}#{post.seq}",),
    )


def example_events() -> list[Event]:
    """Two subscriptions changing plan, and their seat ledgers, in order."""
    events = []
    for sub in ("s1", "s2"):
        events += [
            event(sub, 1, "subscription.created", {"plan": "basic", "price_cents": 900}),
            event(sub, 2, "subscription.plan_changed", {"plan": "pro", "price_cents": 2900}),
            event(sub, 3, "subscription.cancelled", {"plan": "pro", "status": "cancelled"}),
            event(sub, 1, "seat_ledger.opened", {"seats": 3}),
            event(sub, 2, "seat_ledger.seats_added", {"count": 2}),
            event(sub, 3, "seat_ledger.seats_added", {"count": -1}),
        ]
    return events
