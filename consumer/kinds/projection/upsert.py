"""The projection's pure decisions: the newest event of each entity, its record, the upsert.

The upsert writes a row only when its ``(generation, seq)`` is newer than the stored
one, so stale and duplicate events change nothing, whatever order they arrive in.
Several streams may feed one table, each owning its own columns and its own version
columns (the seed's vector of per-source versions, merged by field): each stream's
update is guarded by its own versions alone, and a version it has never written (NULL,
in a row another stream created) is older than anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import sql

from consumer.kinds.projection.route import ProjectionRoute
from schemas import Event


def newest_per_entity(events: Sequence[Event]) -> tuple[list[Event], list[Event]]:
    """The newest event of each entity by (generation, seq), and the events it supersedes.

    The newest are in entity order, so every writer of a table locks its rows in one order
    (streams that share a table's rows cannot deadlock each other).
    """
    newest: dict[str, Event] = {}
    superseded: list[Event] = []
    for event in events:
        held = newest.get(event.entity_id)
        if held is None:
            newest[event.entity_id] = event
        elif event.version > held.version:
            superseded.append(held)
            newest[event.entity_id] = event
        else:
            superseded.append(event)
    return [newest[e] for e in sorted(newest)], superseded


def field_value(payload: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The payload value at a dotted path; None where the path does not exist."""
    value: Any = payload
    for part in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _field(payload: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    # Most mapped fields are top-level: one dict lookup, no loop.
    return payload.get(path[0]) if len(path) == 1 else field_value(payload, path)


def record(route: ProjectionRoute, event: Event) -> dict[str, Any]:
    """One input record of the upsert: fields f0.. in the statement's column order."""
    values: list[Any] = [event.entity_id]
    if route.entity_type_column:
        values.append(event.entity_type)
    values += [event.generation, event.seq]
    payload = event.payload
    values += [_field(payload, path) for path in route.columns.values()]
    return dict(zip(_FIELD_NAMES, values, strict=False))


# Record field names f0, f1, ... (a route has at most a few dozen columns).
_FIELD_NAMES = tuple(f"f{i}" for i in range(1600))


def target_columns(route: ProjectionRoute) -> list[str]:
    """The columns the upsert writes: the key(s), generation, seq, then the mapped ones."""
    keys = [route.key] if not route.entity_type_column else [route.key, route.entity_type_column]
    return [*keys, route.generation_column, route.seq_column, *route.columns]


def upsert_statement(route: ProjectionRoute, types: Mapping[str, str]) -> sql.Composed:
    """``INSERT .. SELECT FROM jsonb_to_recordset .. ON CONFLICT DO UPDATE WHERE newer``."""
    columns = target_columns(route)  # the order record() writes f0, f1, ...
    conflict = (
        [route.key] if not route.entity_type_column else [route.entity_type_column, route.key]
    )
    table = route.table_sql
    fields = [sql.Identifier(f"f{i}") for i in range(len(columns))]
    updates = [c for c in columns if c not in conflict]
    gen, seq = sql.Identifier(route.generation_column), sql.Identifier(route.seq_column)
    return sql.SQL(
        "INSERT INTO {table} AS t ({columns}) SELECT {fields} "
        "FROM jsonb_to_recordset(%s::jsonb) AS r({typed}) "
        "ON CONFLICT ({conflict}) DO UPDATE SET {updates} "
        # NULL-safe: a version this stream never wrote is older than any it sends.
        "WHERE ((t.{gen}, t.{seq}) < (EXCLUDED.{gen}, EXCLUDED.{seq})) IS NOT FALSE "
        "RETURNING t.{key}"
    ).format(
        table=table,
        columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
        fields=sql.SQL(", ").join(sql.SQL("r.{}").format(f) for f in fields),
        typed=sql.SQL(", ").join(
            sql.SQL("{} {}").format(f, sql.SQL(types[c]))
            for f, c in zip(fields, columns, strict=True)
        ),
        conflict=sql.SQL(", ").join(map(sql.Identifier, conflict)),
        updates=sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates
        ),
        gen=gen,
        seq=seq,
        key=sql.Identifier(route.key),
    )
