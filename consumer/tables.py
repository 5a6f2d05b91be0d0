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

from consumer.errors import SchemaNotReadyError
from consumer.kinds import Kind
from schemas.errors import MigrationError
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
    """Apply every pending migration of ``sets``; return those applied.

    A role that may not apply them (a program's own, with the owner's migrations not run
    yet) raises ``SchemaNotReadyError``: the program waits for the owner.
    """
    try:
        return runner.apply(conn, sets)
    except (psycopg.errors.InsufficientPrivilege, MigrationError) as exc:
        denied = exc if isinstance(exc, psycopg.Error) else exc.__cause__
        if not isinstance(denied, psycopg.errors.InsufficientPrivilege):
            raise
        if not conn.autocommit:
            conn.rollback()
        raise SchemaNotReadyError(
            "the consumer's tables need migrations this role may not apply (or read): run "
            "`inorder-consumer migrate` as the tables' owner, then grant them"
        ) from None
