"""The consumer's own tables (step progress and log, gaps, batch manifests, dead letters).

Their schema changes only through the versioned migrations in ``consumer/migrations``,
run by the same runner as the outbox's, under an advisory lock, so several consumers
and sweepers starting at once apply each file exactly once. A database made by the
release before migrations is adopted by the first one unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from consumer.kinds import Kind
from schemas.runtime import migrate as runner
from schemas.runtime.migrate import Migration, MigrationSet

CONSUMER = MigrationSet("consumer", "consumer")


def migration_sets(kinds: Sequence[Kind] = ()) -> list[MigrationSet]:
    """The consumer's own set, then whatever the given route kinds write to (the outbox)."""
    sets = [CONSUMER]
    for kind in kinds:
        sets += [s for s in kind.migrations if s not in sets]
    return sets


def migrate(
    conn: psycopg.Connection[Any], sets: Sequence[MigrationSet] = (CONSUMER,)
) -> list[Migration]:
    """Apply every pending migration of ``sets``; return those applied."""
    return runner.apply(conn, sets)
