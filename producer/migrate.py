"""Versioned, idempotent SQL migrations, applied under an advisory lock.

Migrations come in sets (``outbox`` always; ``example`` for the example service),
each a folder of ``NNNN_name.sql`` files. Applied versions are recorded in
``inorder_migrations`` in the connection's current schema, so running twice, or
from two processes at once, applies each file exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
import structlog

from producer.errors import MigrationError

log = structlog.get_logger(__name__)

OUTBOX = "outbox"
EXAMPLE = "example"

_LEDGER = """
CREATE TABLE IF NOT EXISTS inorder_migrations (
    migration_set text        NOT NULL,
    version       integer     NOT NULL,
    name          text        NOT NULL,
    applied_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (migration_set, version)
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    """One SQL file of a migration set."""

    migration_set: str
    version: int
    name: str
    sql: str


def available(migration_set: str) -> list[Migration]:
    """The migrations shipped for ``migration_set``, in version order."""
    folder = resources.files("producer").joinpath("migrations").joinpath(migration_set)
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version, _, name = entry.name.removesuffix(".sql").partition("_")
            found.append(Migration(migration_set, int(version), name, entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def apply(conn: psycopg.Connection[Any], sets: tuple[str, ...] = (OUTBOX,)) -> list[Migration]:
    """Apply every pending migration of ``sets`` in one transaction; return those applied."""
    applied: list[Migration] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('inorder_migrations'))")
        conn.execute(_LEDGER)
        for migration_set in sets:
            done = {
                row[0]
                for row in conn.execute(
                    "SELECT version FROM inorder_migrations WHERE migration_set = %s",
                    (migration_set,),
                )
            }
            for migration in available(migration_set):
                if migration.version not in done:
                    _run(conn, migration)
                    applied.append(migration)
    return applied


def _run(conn: psycopg.Connection[Any], migration: Migration) -> None:
    try:
        conn.execute(migration.sql.encode())
    except psycopg.Error as exc:
        raise MigrationError(
            f"{migration.migration_set}/{migration.version:04d}_{migration.name}.sql: {exc}"
        ) from exc
    conn.execute(
        "INSERT INTO inorder_migrations (migration_set, version, name) VALUES (%s, %s, %s)",
        (migration.migration_set, migration.version, migration.name),
    )
    log.info(
        "migration_applied",
        migration_set=migration.migration_set,
        version=migration.version,
        name=migration.name,
    )
