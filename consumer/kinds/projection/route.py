"""A projection route: the stream it reads, its table, the key and the columns it writes.

Its route::

    [[route]]
    stream = "subscription"          # the events' entity_type
    kind = "projection"
    table = "billing_view"           # may be schema-qualified: "reporting.billing_view"
    key = "subscription_id"          # the column that holds entity_id
    [route.columns]                  # column = payload field (dotted for nested fields)
    plan = "plan"
    price_cents = "price_cents"

Several streams may feed one table (two services, one read model): each route names the
same table and key, its own ``generation_column`` and ``seq_column``, and columns no other
route writes. Each stream's update is then guarded by its own versions, and merges into the
row by field. A field two services change must be routed through one owner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from consumer.kinds._route import OneStream
from consumer.kinds._spec import Spec, default, names, setting


@dataclass(frozen=True, slots=True)
class ProjectionRoute(OneStream):
    """Last writer wins: keep the newest (generation, seq) of each entity in one table row."""

    stream: str
    table: str = setting("The table, `name` or `schema.name`")
    key: str = setting("The column holding `entity_id`: a primary key or unique index")
    columns: Mapping[str, tuple[str, ...]] = setting(
        "`[route.columns]`: table column = payload field; dotted paths reach nested fields, "
        "an absent field writes NULL"
    )
    generation_column: str = setting(
        "The column keeping the stored generation (streams merged into one table's rows each "
        "have their own)",
        "generation",
    )
    seq_column: str = setting("The column keeping the stored seq (one per stream, likewise)", "seq")
    entity_type_column: str | None = setting(
        "For a table shared by several streams: the column holding `entity_type` (the key "
        "is then both)",
        None,
    )
    kind: str = field(default="projection", init=False)

    @property
    def schema_and_table(self) -> tuple[str | None, str]:
        """The table's schema (None: the search path) and name."""
        schema, _, name = self.table.rpartition(".")
        return (schema or None), name

    @property
    def table_sql(self) -> sql.Identifier:
        """The table as a quoted SQL name, schema-qualified when the route names a schema."""
        schema, name = self.schema_and_table
        return sql.Identifier(schema, name) if schema else sql.Identifier(name)


# ---------------------------------------------------------------- the routes file


def _table(spec: Spec, value: Any) -> str:
    parts = value.split(".") if isinstance(value, str) else [value]
    if len(parts) > 2:
        spec.problem(f"table must be 'name' or 'schema.name', got {value!r}")
        return ""
    return ".".join(spec.identifier("table", p) for p in parts)


def _columns(spec: Spec, value: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, Mapping) or not value:
        spec.problem("[route.columns] must map at least one column to a payload field")
        return {}
    out = {}
    for column, path in value.items():
        spec.identifier("a column", column)
        if not isinstance(path, str) or not path or "" in path.split("."):
            spec.problem(f"column {column} must name a payload field, got {path!r}")
            continue
        out[column] = tuple(path.split("."))
    return out


def parse(spec: Spec) -> ProjectionRoute:
    """A projection route from its ``[[route]]`` table; problems go to ``spec``."""
    spec.only("projection", names(ProjectionRoute))
    values = spec.values
    for required in ("table", "key", "columns"):
        if required not in values:
            spec.problem(f"a projection route needs {required!r}")
    entity_type_column = values.get("entity_type_column")

    def column(name: str) -> str:
        return spec.identifier(name, values.get(name, default(ProjectionRoute, name)))

    route = ProjectionRoute(
        stream=spec.stream,
        table=_table(spec, values["table"]) if "table" in values else "",
        key=spec.identifier("key", values["key"]) if "key" in values else "",
        columns=_columns(spec, values["columns"]) if "columns" in values else {},
        generation_column=column("generation_column"),
        seq_column=column("seq_column"),
        entity_type_column=(
            spec.identifier("entity_type_column", entity_type_column)
            if entity_type_column is not None
            else None
        ),
    )
    _own_columns(spec, route)
    return route


def _own_columns(spec: Spec, route: ProjectionRoute) -> None:
    """Each column of the row has one role: the key, the stream's versions, or one field."""
    roles = {
        "key": route.key,
        "entity_type_column": route.entity_type_column,
        "generation_column": route.generation_column,
        "seq_column": route.seq_column,
    }
    seen: dict[str, str] = {}
    for role, column in roles.items():
        if column and column in seen:
            spec.problem(f"{role} and {seen[column]} are both {column!r}; give each its own column")
        elif column:
            seen[column] = role
    for column in route.columns:
        if column in seen:
            spec.problem(
                f"[route.columns] maps {column!r}, which is the route's {seen[column]}; "
                "map the field to a column of its own"
            )


def together(routes: Sequence[ProjectionRoute]) -> list[str]:
    """Problems among projection routes that write one table (several sources, one row).

    Streams that share a table's rows (no ``entity_type_column``) merge by field: they
    must name the same key, and each column, version columns included, must have exactly
    one owner. Streams that keep their own rows in one table (``entity_type_column``)
    must all say so, with the same column and key. A table written ``name`` in one route
    and ``schema.name`` in another is taken to be the same one.
    """
    problems: list[str] = []
    by_table: dict[str, list[ProjectionRoute]] = {}
    for route in routes:
        by_table.setdefault(route.schema_and_table[1], []).append(route)
    for group in by_table.values():
        for i, one in enumerate(group):
            for other in group[i + 1 :]:
                if _same_table(one, other):
                    problems += _shared(one, other)
    return problems


def _same_table(one: ProjectionRoute, other: ProjectionRoute) -> bool:
    schemas = {one.schema_and_table[0], other.schema_and_table[0]}
    return len(schemas) == 1 or None in schemas


def _shared(one: ProjectionRoute, other: ProjectionRoute) -> list[str]:
    where = f"routes {one.stream} and {other.stream} (table {one.table})"
    if (one.key, one.entity_type_column) != (other.key, other.entity_type_column):
        return [
            f"{where}: streams writing one table must name the same key and "
            f"entity_type_column (got {one.key}/{one.entity_type_column} and "
            f"{other.key}/{other.entity_type_column})"
        ]
    if one.entity_type_column:
        return []  # each stream has rows of its own
    both = sorted(_owned(one) & _owned(other))
    if not both:
        return []
    return [
        f"{where}: both write {', '.join(both)}; streams merged into one row must each own "
        "their columns and their own generation_column and seq_column (route a field "
        "two services change through one owner)"
    ]


def _owned(route: ProjectionRoute) -> set[str]:
    """The columns a route's upsert writes besides the key it shares."""
    return {route.generation_column, route.seq_column, *route.columns}
