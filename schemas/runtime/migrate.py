"""Versioned SQL migrations, applied once each under an advisory lock.

A migration set is a folder of ``NNNN_name.sql`` files that belongs to one package:
the outbox's (``schemas.outbox``), the consumer's own tables, the example service.
Applied versions are recorded in ``inorder_migrations`` in the connection's current
schema, so running twice, or from several processes at once, applies each file once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import psycopg
import structlog

from schemas.errors import MigrationError

log = structlog.get_logger(__name__)

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
class MigrationSet:
    """A named folder of migrations inside a package: ``<package>/<folder>/NNNN_name.sql``."""

    name: str
    package: str
    folder: str = "migrations"

    def files(self) -> Traversable:
        """The folder holding the set's SQL files."""
        return resources.files(self.package).joinpath(self.folder)


@dataclass(frozen=True, slots=True)
class Migration:
    """One SQL file of a migration set."""

    migration_set: str
    version: int
    name: str
    sql: str


def available(migration_set: MigrationSet) -> list[Migration]:
    """The migrations shipped in ``migration_set``, in version order."""
    found = []
    for entry in migration_set.files().iterdir():
        if entry.name.endswith(".sql"):
            version, _, name = entry.name.removesuffix(".sql").partition("_")
            found.append(Migration(migration_set.name, int(version), name, entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def pending(conn: psycopg.Connection[Any], sets: Sequence[MigrationSet]) -> list[Migration]:
    """The migrations of ``sets`` not yet applied, read with SELECT only.

    A role that may not create anything (a program's own, once the owner has migrated)
    can ask this; every migration is pending while the ledger does not exist.
    """
    return _not_in(sets, _recorded(conn) or set())


def _recorded(conn: psycopg.Connection[Any]) -> set[tuple[str, int]] | None:
    """(set, version) of every migration the ledger records; None when there is no ledger."""
    row = conn.execute("SELECT to_regclass('inorder_migrations') IS NOT NULL").fetchone()
    if not (row and row[0]):
        return None
    return {
        (str(name), int(version))
        for name, version in conn.execute("SELECT migration_set, version FROM inorder_migrations")
    }


def _not_in(sets: Sequence[MigrationSet], done: set[tuple[str, int]]) -> list[Migration]:
    return [
        migration
        for migration_set in sets
        for migration in available(migration_set)
        if (migration.migration_set, migration.version) not in done
    ]


def apply(conn: psycopg.Connection[Any], sets: Sequence[MigrationSet]) -> list[Migration]:
    """Apply every pending migration of ``sets`` in one transaction; return those applied.

    Nothing pending: nothing is run, not even the ledger's CREATE, so a program whose role
    may not create tables starts on a database its owner has migrated.
    """
    applied: list[Migration] = []
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    recorded = _recorded(conn)
    settled = recorded is not None and not _not_in(sets, recorded)
    if idle and not conn.autocommit:
        conn.rollback()  # end the read, as the caller had no transaction open
    if settled:
        return applied
    with conn.transaction():
        # A migration may rewrite a large table, and waits its turn behind another
        # program's: neither is bounded by the connection's default timeouts.
        conn.execute("SET LOCAL statement_timeout = 0")
        conn.execute("SET LOCAL lock_timeout = 0")
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('inorder_migrations'))")
        conn.execute(_LEDGER)
        for migration_set in sets:
            done = {
                row[0]
                for row in conn.execute(
                    "SELECT version FROM inorder_migrations WHERE migration_set = %s",
                    (migration_set.name,),
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
