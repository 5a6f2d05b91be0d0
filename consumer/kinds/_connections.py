"""The PostgreSQL connections the consumer's routes may hold, against what the server allows.

A step route's lanes each hold a connection while they work, and a lane running ``async
def`` steps a second one, on the lanes' event loop. Routes whose connections, with the
consumer's own, could exceed what the server gives ordinary sessions can never run as
configured: their pools would take every free slot (the application's own sessions
then refused) and keep asking for the rest. So start-up refuses them, naming each
route's share and what to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

# Connections ordinary sessions may open: max_connections less the slots kept for
# superusers and, from PostgreSQL 16, for roles granted pg_use_reserved_connections.
_SLOTS = """
SELECT current_setting('max_connections')::int,
       current_setting('max_connections')::int
       - current_setting('superuser_reserved_connections')::int
       - coalesce(nullif(current_setting('reserved_connections', true), '')::int, 0)
"""


def lane_connections(lanes: int, *, awaited: bool) -> int:
    """The most connections ``lanes`` lanes hold at once (two each with async def steps)."""
    return lanes * (2 if awaited else 1)


def connections_problem(conn: psycopg.Connection[Any], held: Mapping[str, int]) -> str | None:
    """What is wrong with the connections each route may hold (``held``, by stream) on the
    server ``conn`` is connected to; None when they fit beside the consumer's own."""
    row = conn.execute(_SLOTS).fetchone()
    assert row is not None
    return verdict(row[0], row[1], held)


def verdict(most: int, ordinary: int, held: Mapping[str, int]) -> str | None:
    """``connections_problem`` once the server's ``max_connections`` and its ``ordinary``
    slots are known."""
    need = sum(held.values())
    if need + 1 <= ordinary:  # the consumer's own connection as well
        return None
    shares = ", ".join(f"{stream} {count}" for stream, count in held.items())
    return (
        f"the routes' lanes hold up to {need} PostgreSQL connections ({shares}; two a lane "
        f"with async def handlers), and the consumer one more; the server takes {ordinary} "
        f"from ordinary sessions (max_connections {most}): lower lanes or raise "
        "max_connections"
    )
