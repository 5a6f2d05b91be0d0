"""The example subscription service: its state changes and their events, one transaction each.

Two entity streams come from it. ``subscription`` events carry the full state of
the subscription (plan, price, status), so a consumer may keep only the newest:
they suit a last-writer-wins projection. ``seat_ledger`` events carry deltas
(seats added), so every one must be applied, in order: they suit a step handler.
Deleting and re-creating a subscription starts a new generation of both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from producer import versioning
from producer.versioning import Version
from schemas import DEFAULT_TOPICS
from schemas.outbox import OutboxEvent, emit, emit_many

SUBSCRIPTION = "subscription"
SEAT_LEDGER = "seat_ledger"
PLAN_PRICES_CENTS = {"free": 0, "basic": 900, "pro": 2900, "enterprise": 9900}


def _subscription_event(
    sub_id: str, version: Version, event_type: str, plan: str, *, status: str, topic: str
) -> OutboxEvent:
    payload = {"plan": plan, "price_cents": PLAN_PRICES_CENTS[plan], "status": status}
    return OutboxEvent(
        SUBSCRIPTION,
        sub_id,
        version.seq,
        f"{SUBSCRIPTION}.{event_type}",
        payload,
        generation=version.generation,
        topic=topic,
    )


def _ledger_event(
    sub_id: str, version: Version, event_type: str, payload: dict[str, Any], *, topic: str
) -> OutboxEvent:
    return OutboxEvent(
        SEAT_LEDGER,
        sub_id,
        version.seq,
        f"{SEAT_LEDGER}.{event_type}",
        payload,
        generation=version.generation,
        topic=topic,
    )


def _open(
    conn: psycopg.Connection[Any],
    sub_id: str,
    plan: str,
    seats: int,
    topic: str,
    start: Callable[[psycopg.Connection[Any], str, str, dict[str, Any]], Version],
) -> Version:
    """Start a generation of both entities (``versioning.create`` or ``recreate``) and emit it."""
    with conn.transaction():
        values = {"plan": plan, "price_cents": PLAN_PRICES_CENTS[plan]}
        version = start(conn, "subscriptions", sub_id, values)
        ledger = start(conn, "seat_ledgers", sub_id, {"seats": seats})
        emit_many(
            conn,
            [
                _subscription_event(sub_id, version, "created", plan, status="active", topic=topic),
                _ledger_event(sub_id, ledger, "opened", {"seats": seats}, topic=topic),
            ],
        )
    return version


def create_subscription(
    conn: psycopg.Connection[Any],
    sub_id: str,
    plan: str,
    seats: int = 1,
    *,
    topic: str = DEFAULT_TOPICS.events,
) -> Version:
    """Create a subscription and its seat ledger; emits ``subscription.created`` and ``opened``."""
    return _open(conn, sub_id, plan, seats, topic, versioning.create)


def change_plan(
    conn: psycopg.Connection[Any], sub_id: str, plan: str, *, topic: str = DEFAULT_TOPICS.events
) -> Version:
    """Change the plan; emits ``subscription.plan_changed`` with the full new state."""
    price = PLAN_PRICES_CENTS[plan]
    with conn.transaction():
        version, _ = versioning.bump(
            conn, "subscriptions", sub_id, set_values={"plan": plan, "price_cents": price}
        )
        emit(
            conn,
            _subscription_event(
                sub_id, version, "plan_changed", plan, status="active", topic=topic
            ),
        )
    return version


def add_seats(
    conn: psycopg.Connection[Any], sub_id: str, count: int, *, topic: str = DEFAULT_TOPICS.events
) -> Version:
    """Add seats; emits ``seat_ledger.seats_added`` carrying the delta and the new total."""
    with conn.transaction():
        version, row = versioning.bump(
            conn, "seat_ledgers", sub_id, add={"seats": count}, returning=("seats",)
        )
        payload = {"count": count, "seats": row["seats"]}
        emit(conn, _ledger_event(sub_id, version, "seats_added", payload, topic=topic))
    return version


def delete_subscription(
    conn: psycopg.Connection[Any], sub_id: str, *, topic: str = DEFAULT_TOPICS.events
) -> Version:
    """Delete a subscription and close its ledger; the id can be re-created later."""
    with conn.transaction():
        version, row = versioning.delete(conn, "subscriptions", sub_id, returning=("plan",))
        ledger, seats = versioning.delete(conn, "seat_ledgers", sub_id, returning=("seats",))
        emit_many(
            conn,
            [
                _subscription_event(
                    sub_id, version, "deleted", row["plan"], status="deleted", topic=topic
                ),
                _ledger_event(sub_id, ledger, "closed", {"seats": seats["seats"]}, topic=topic),
            ],
        )
    return version


def recreate_subscription(
    conn: psycopg.Connection[Any],
    sub_id: str,
    plan: str,
    seats: int = 1,
    *,
    topic: str = DEFAULT_TOPICS.events,
) -> Version:
    """Re-create a deleted subscription as a new generation; its seqs restart at 1."""
    return _open(conn, sub_id, plan, seats, topic, versioning.recreate)
