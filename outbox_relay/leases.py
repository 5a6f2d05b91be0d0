"""Slice leases in PostgreSQL: membership, taking, renewing and giving back. Thin I/O only.

Every lease time comes from PostgreSQL's clock, so relays on different machines agree.
A relay holds a slice until it gives it back or lets its lease expire; another relay
may take a slice only when it is free or its lease has expired, and every cursor write
is fenced by the owner (``store.save_cursors``), so a relay that lost a slice cannot move it.
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox_relay.frontier import Cursor
from outbox_relay.store import Conn, cursor_from

_TAKE = """
UPDATE outbox_relay_slices
   SET owner = %(me)s, lease_until = now() + make_interval(secs => %(lease_s)s)
 WHERE slice = ANY(%(slices)s)
   AND (owner IS NULL OR owner = %(me)s OR lease_until < now())
RETURNING slice, cursor_xid::text, cursor_id, running::text[], running_pos
"""


@dataclass(frozen=True, slots=True)
class Membership:
    """What one look at the lease table showed."""

    live: list[str]
    owned: set[int]
    available: set[int]
    slices: int


def heartbeat(
    conn: Conn, me: str, held: list[int], lease_s: float, retention_s: float | None = None
) -> tuple[set[int], Membership]:
    """Renew leases, look at the membership: the slices of ``held`` still held, and who is who.

    ``me`` says it is alive (and how long it keeps sent rows), relays long gone are
    forgotten, and the lease table shows who holds what and what is free. All of it in one
    round trip (a pipeline): the relay does this every third of a lease between two
    batches, and a row committed meanwhile waits.
    """
    with conn.pipeline():
        renewed = conn.execute(
            "UPDATE outbox_relay_slices SET lease_until = now() + make_interval(secs => %s)"
            " WHERE owner = %s AND slice = ANY(%s) RETURNING slice",
            (lease_s, me, held),
        )
        conn.execute(
            "INSERT INTO outbox_relays (relay_id, seen_until, retention_s)"
            " VALUES (%(me)s, now() + make_interval(secs => %(lease_s)s), %(retention_s)s)"
            " ON CONFLICT (relay_id) DO UPDATE SET seen_until = excluded.seen_until,"
            " retention_s = excluded.retention_s",
            {"me": me, "lease_s": lease_s, "retention_s": retention_s},
        )
        conn.execute(
            "DELETE FROM outbox_relays WHERE seen_until < now() - make_interval(secs => %s)",
            (lease_s * 10,),
        )
        alive = conn.execute(
            "SELECT relay_id FROM outbox_relays WHERE seen_until >= now() ORDER BY relay_id"
        )
        leases = conn.execute(
            "SELECT slice, owner = %s, owner IS NULL OR lease_until < now()"
            " FROM outbox_relay_slices",
            (me,),
        )
        still = {row[0] for row in renewed.fetchall()}  # the one sync, for all five
        live = [row[0] for row in alive.fetchall()]
        rows = leases.fetchall()
    owned: set[int] = set()
    available: set[int] = set()
    for slice_, mine, free in rows:
        if mine and not free:
            owned.add(slice_)
        elif free:
            available.add(slice_)
    return still, Membership(live, owned, available, len(rows))


def take(conn: Conn, me: str, slices: list[int], lease_s: float) -> dict[int, Cursor]:
    """Take these slices where still free or expired; their stored cursors."""
    found = conn.execute(_TAKE, {"me": me, "slices": slices, "lease_s": lease_s}).fetchall()
    return {s: cursor_from(x, i, running, pos) for s, x, i, running, pos in found}


def release(conn: Conn, me: str, slices: list[int]) -> None:
    """Give these slices back at once, so another relay need not wait for the lease to expire."""
    conn.execute(
        "UPDATE outbox_relay_slices SET owner = NULL, lease_until = NULL"
        " WHERE owner = %s AND slice = ANY(%s)",
        (me, slices),
    )


def leave(conn: Conn, me: str) -> None:
    """Give back every slice and drop out of the membership (a clean stop)."""
    conn.execute(
        "UPDATE outbox_relay_slices SET owner = NULL, lease_until = NULL WHERE owner = %s", (me,)
    )
    conn.execute("DELETE FROM outbox_relays WHERE relay_id = %s", (me,))
