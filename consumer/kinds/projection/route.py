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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from consumer.kinds._base import OneStream
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
    generation_column: str = setting("The column keeping the stored generation", "generation")
    seq_column: str = setting("The column keeping the stored seq", "seq")
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

    return ProjectionRoute(
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
