"""The producer's migration sets: the outbox table, and the example service's tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from schemas import outbox
from schemas.runtime import migrate
from schemas.runtime.migrate import Migration, MigrationSet

OUTBOX = outbox.MIGRATIONS
EXAMPLE = MigrationSet("example", "producer", "migrations/example")


def available(migration_set: MigrationSet) -> list[Migration]:
    """The migrations shipped in ``migration_set``, in version order."""
    return migrate.available(migration_set)


def apply(
    conn: psycopg.Connection[Any], sets: Sequence[MigrationSet] = (OUTBOX,)
) -> list[Migration]:
    """Apply every pending migration of ``sets``; return those applied."""
    return migrate.apply(conn, sets)
