"""Step functions for the fault suite: the example's effect, plus one row per application.

``fault_effects`` has no key on purpose: a step applied twice shows as two rows, a
step never applied as none, whatever the consumer's own bookkeeping says.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

from consumer import examples
from schemas import Event

TABLE = """
CREATE TABLE IF NOT EXISTS fault_effects (
    entity_id  text   NOT NULL,
    generation bigint NOT NULL,
    seq        bigint NOT NULL
)
"""

ROUTES = (
    examples.PROJECTION_ROUTE
    + """
[[route]]
stream = "seat_ledger"
kind = "step"
[route.handlers]
"seat_ledger.opened" = "tests.faults.effects:open_ledger"
"seat_ledger.seats_added" = "tests.faults.effects:add_seats"
"""
)


def _record(conn: psycopg.Connection[Any], event: Event) -> None:
    conn.execute(
        "INSERT INTO fault_effects (entity_id, generation, seq) VALUES (%s, %s, %s)",
        (event.entity_id, event.generation, event.seq),
    )


def open_ledger(conn: psycopg.Connection[Any], event: Event) -> None:
    """Open the ledger as the example does, and record the application."""
    examples.open_ledger(conn, event)
    _record(conn, event)


def add_seats(conn: psycopg.Connection[Any], event: Event) -> None:
    """Add the seats as the example does, and record the application."""
    examples.add_seats(conn, event)
    _record(conn, event)


CALLS_TABLE = """
CREATE TABLE IF NOT EXISTS fault_calls (
    entity_id text   NOT NULL,
    seq       bigint NOT NULL
)
"""
# A step route whose handler calls "outside": 16 lanes, and a second call is not harmless.
MAIL_ROUTE = """
[[route]]
stream = "mail"
kind = "step"
lanes = 16
[route.handlers."mail.sent"]
function = "tests.faults.effects:send_mail"
external = true
"""
_outside = threading.local()  # each lane's own connection to "the world outside"


def send_mail(conn: psycopg.Connection[Any], event: Event) -> None:
    """An API call that takes 100 ms and cannot be undone: written at once, on its own connection.

    The world outside keeps every call, whether or not the step's transaction commits;
    the step itself is recorded in ``fault_effects`` with the step's transaction.
    """
    outside = getattr(_outside, "conn", None)
    if outside is None or outside.closed:
        # The world outside is not behind the consumer's own link to PostgreSQL (a fault
        # proxy may stand there): FAULT_OUTSIDE_URL when the pipeline gives it.
        url = os.environ.get("FAULT_OUTSIDE_URL") or os.environ["DATABASE_URL"]
        outside = _outside.conn = psycopg.connect(url, autocommit=True)
    outside.execute(
        "INSERT INTO fault_calls (entity_id, seq) VALUES (%s, %s)", (event.entity_id, event.seq)
    )
    time.sleep(0.1)
    _record(conn, event)


def always_down(conn: psycopg.Connection[Any], event: Event) -> None:
    """A step whose database is always away: the consumer waits it out, never refuses it."""
    raise psycopg.OperationalError(f"the ledger of {event.entity_id} is away")
