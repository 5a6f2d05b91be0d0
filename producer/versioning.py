"""The version-column pattern: the entity's row assigns each event's (generation, seq).

A table used with these helpers has ``id text primary key``, ``generation bigint``,
``version bigint`` and ``deleted boolean`` columns beside its own. Every change
bumps ``version`` in the same UPDATE that changes the state and returns it, so
concurrent writers get distinct, gap-free versions in commit order: the row lock
serialises them. Table and column names are quoted identifiers, never formatted in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from producer.errors import EntityExistsError, EntityNotFoundError

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Version:
    """An entity's version after a change; publish it as the event's (generation, seq)."""

    generation: int
    seq: int


def _returning(columns: tuple[str, ...]) -> sql.Composable:
    names = ("generation", "version", *columns)
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def _fetch(cur: psycopg.Cursor[Any], columns: tuple[str, ...]) -> tuple[Version, Row] | None:
    row = cur.fetchone()
    if row is None:
        return None
    return Version(row[0], row[1]), dict(zip(columns, row[2:], strict=True))


def create(
    conn: psycopg.Connection[Any], table: str, entity_id: str, values: Mapping[str, Any]
) -> Version:
    """Insert a new entity at generation 1, version 1."""
    names = ["id", *values]
    query = sql.SQL(
        "INSERT INTO {table} ({cols}, generation, version, deleted) "
        "VALUES ({params}, 1, 1, false) ON CONFLICT (id) DO NOTHING RETURNING generation, version"
    ).format(
        table=sql.Identifier(table),
        cols=sql.SQL(", ").join(map(sql.Identifier, names)),
        params=sql.SQL(", ").join(sql.Placeholder() * len(names)),
    )
    row = conn.execute(query, [entity_id, *values.values()]).fetchone()
    if row is None:
        raise EntityExistsError(f"{table} {entity_id!r} exists; re-create it after deleting it")
    return Version(row[0], row[1])


def bump(
    conn: psycopg.Connection[Any],
    table: str,
    entity_id: str,
    *,
    set_values: Mapping[str, Any] | None = None,
    add: Mapping[str, int] | None = None,
    returning: tuple[str, ...] = (),
    deleting: bool = False,
) -> tuple[Version, Row]:
    """Change a live entity and bump its version in one UPDATE; return the new version.

    ``set_values`` assigns columns, ``add`` increments them, ``returning`` names
    columns to read back after the change. ``deleting`` marks the entity deleted.
    """
    sets: list[sql.Composable] = [sql.SQL("version = version + 1"), sql.SQL("updated_at = now()")]
    params: list[Any] = []
    for name, value in (set_values or {}).items():
        sets.append(sql.SQL("{} = %s").format(sql.Identifier(name)))
        params.append(value)
    for name, delta in (add or {}).items():
        sets.append(sql.SQL("{0} = {0} + %s").format(sql.Identifier(name)))
        params.append(delta)
    if deleting:
        sets.append(sql.SQL("deleted = true"))
    query = sql.SQL("UPDATE {} SET {} WHERE id = %s AND NOT deleted RETURNING {}").format(
        sql.Identifier(table), sql.SQL(", ").join(sets), _returning(returning)
    )
    with conn.cursor() as cur:
        cur.execute(query, [*params, entity_id])
        found = _fetch(cur, returning)
    if found is None:
        raise EntityNotFoundError(f"{table} {entity_id!r} does not exist or is deleted")
    return found


def delete(
    conn: psycopg.Connection[Any], table: str, entity_id: str, *, returning: tuple[str, ...] = ()
) -> tuple[Version, Row]:
    """Mark a live entity deleted; the deletion is itself a version of the entity."""
    return bump(conn, table, entity_id, returning=returning, deleting=True)


def recreate(
    conn: psycopg.Connection[Any], table: str, entity_id: str, values: Mapping[str, Any]
) -> Version:
    """Bring a deleted id back as a new generation whose versions restart at 1."""
    sets = [sql.SQL("{} = %s").format(sql.Identifier(name)) for name in values]
    query = sql.SQL(
        "UPDATE {} SET generation = generation + 1, version = 1, deleted = false, "
        "updated_at = now(), {} WHERE id = %s AND deleted RETURNING generation, version"
    ).format(sql.Identifier(table), sql.SQL(", ").join(sets))
    row = conn.execute(query, [*values.values(), entity_id]).fetchone()
    if row is None:
        raise EntityNotFoundError(f"{table} {entity_id!r} is not a deleted entity")
    return Version(row[0], row[1])
