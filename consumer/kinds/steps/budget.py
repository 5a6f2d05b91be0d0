"""How many PostgreSQL connections a step route's lanes may hold, against what the server allows.

Each lane holds a connection while it works, and a lane running ``async def`` steps a
second one, on the lanes' event loop, for the run. A route whose lanes alone could take
more connections than the server gives ordinary sessions can never run as configured:
its pools would take every free slot (the application's own sessions then refused) and
keep asking for the rest. So start-up refuses it, naming what to change.
"""

from __future__ import annotations

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


def problem(conn: psycopg.Connection[Any], stream: str, lanes: int, *, awaited: bool) -> str | None:
    """What is wrong with route ``stream``'s lanes on the server ``conn`` is connected to;
    None when they fit beside the consumer's own connection."""
    row = conn.execute(_SLOTS).fetchone()
    assert row is not None
    return verdict(row[0], row[1], stream, lanes, awaited=awaited)


def verdict(most: int, ordinary: int, stream: str, lanes: int, *, awaited: bool) -> str | None:
    """``problem`` once the server's ``max_connections`` and its ``ordinary`` slots are known."""
    need = lane_connections(lanes, awaited=awaited)
    if need + 1 <= ordinary:  # the consumer's own connection as well
        return None
    holds = "two each, with async def handlers" if awaited else "one each"
    return (
        f"route {stream}: {lanes} lanes hold up to {need} PostgreSQL connections ({holds}), "
        f"and the consumer one more; the server takes {ordinary} from ordinary sessions "
        f"(max_connections {most}): lower lanes or raise max_connections"
    )
