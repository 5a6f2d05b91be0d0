"""A projection route and its table: last writer wins, the newest event of each entity, one upsert.

The upsert writes a row only when its ``(generation, seq)`` is newer than the stored
one, so stale and duplicate events change nothing, whatever order they arrive in.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from consumer.deadletter import PROJECTION_REJECTED
from consumer.errors import RoutesError, TableChangedError
from consumer.kinds._base import Conn, Links, OneStream, Outcome, Refusal
from consumer.kinds._spec import Spec, default, names, setting
from schemas import Event
from schemas.runtime.causes import Cause, cause
from schemas.runtime.logs import first_line


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


@dataclass(frozen=True, slots=True)
class ProjectionTable:
    """A projection route checked against its table, with its upsert statement built once.

    The statement is kept as the bytes sent to the server: composing it from its quoted
    parts took about 150 µs, paid again on every batch while it was kept composed.
    """

    route: ProjectionRoute
    statement: bytes
    # The target columns' types when the table was checked, to see a change under it.
    types: Mapping[str, str]


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


# ---------------------------------------------------------------- pure decisions


def newest_per_entity(events: Sequence[Event]) -> tuple[list[Event], list[Event]]:
    """The newest event of each entity by (generation, seq), and the events it supersedes."""
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
    return list(newest.values()), superseded


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


def _target_columns(route: ProjectionRoute) -> list[str]:
    keys = [route.key] if not route.entity_type_column else [route.key, route.entity_type_column]
    return [*keys, route.generation_column, route.seq_column, *route.columns]


def upsert_statement(route: ProjectionRoute, types: Mapping[str, str]) -> sql.Composed:
    """``INSERT .. SELECT FROM jsonb_to_recordset .. ON CONFLICT DO UPDATE WHERE newer``."""
    columns = _target_columns(route)  # the order record() writes f0, f1, ...
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
        "WHERE (t.{gen}, t.{seq}) < (EXCLUDED.{gen}, EXCLUDED.{seq}) "
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


def stored_row(conn: Conn, route: ProjectionRoute, entity_id: str) -> dict[str, Any] | None:
    """One entity's row as the projection holds it (generation, seq, then the mapped columns)."""
    names = [route.generation_column, route.seq_column, *route.columns]
    where = sql.SQL("{}::text = %s").format(sql.Identifier(route.key))
    params: list[Any] = [entity_id]
    if route.entity_type_column:
        where = sql.SQL("{} AND {} = %s").format(where, sql.Identifier(route.entity_type_column))
        params.append(route.stream)
    cur = conn.execute(
        sql.SQL("SELECT {} FROM {} WHERE {}").format(
            sql.SQL(", ").join(map(sql.Identifier, names)), route.table_sql, where
        ),
        params,
    )
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip(["generation", "seq", *route.columns], row, strict=True))


# ---------------------------------------------------------------- start-up check


def _columns_of(conn: Conn, regclass: int) -> dict[str, str]:
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
        (regclass,),
    ).fetchall()
    return dict(rows)


def _unique_keys(conn: Conn, regclass: int) -> list[set[str]]:
    rows = conn.execute(
        "SELECT array_agg(a.attname) FROM pg_index i "
        "CROSS JOIN LATERAL unnest(i.indkey) AS k(attnum) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL GROUP BY i.indexrelid",
        (regclass,),
    ).fetchall()
    return [set(row[0]) for row in rows]


def check_table(conn: Conn, route: ProjectionRoute) -> ProjectionTable:
    """Check the route's table against the database; ``RoutesError`` lists what is missing."""
    where = f"route {route.stream}"
    qualified = route.table_sql.as_string(conn)
    found = conn.execute("SELECT to_regclass(%s)::oid", (qualified,)).fetchone()
    if found is None or found[0] is None:
        raise RoutesError([f"{where}: table {route.table} does not exist; create it first"])
    types = _columns_of(conn, found[0])
    problems = [
        f"{where}: table {route.table} has no column {column!r}"
        for column in _target_columns(route)
        if column not in types
    ]
    conflict = {route.key} | ({route.entity_type_column} if route.entity_type_column else set())
    if conflict not in _unique_keys(conn, found[0]):
        problems.append(
            f"{where}: table {route.table} needs a primary key or unique index on exactly "
            f"({', '.join(sorted(conflict))}) for the upsert"
        )
    if problems:
        raise RoutesError(problems)
    targets = {c: types[c] for c in _target_columns(route)}
    return ProjectionTable(route, upsert_statement(route, types).as_bytes(conn), targets)


def changed(conn: Conn, table: ProjectionTable) -> str | None:
    """What about the route's table changed since it was checked (a column's type, a column,
    the unique index the upsert needs), or None."""
    try:
        now = check_table(conn, table.route)
    except RoutesError as exc:
        return str(exc)
    moved = [
        f"column {c!r} is {now.types[c]}, was {was}"
        for c, was in table.types.items()
        if now.types[c] != was
    ]
    return "; ".join(moved) or None


# ---------------------------------------------------------------- I/O


def _write(conn: Conn, table: ProjectionTable, events: Sequence[Event]) -> set[str]:
    payload = orjson.dumps([record(table.route, e) for e in events])
    rows = conn.execute(table.statement, (payload.decode(),)).fetchall()
    return {str(row[0]) for row in rows}


def apply(conn: Conn, table: ProjectionTable, events: Sequence[Event]) -> Outcome:
    """Write the newest event of each entity; runs inside the caller's transaction.

    If the table refuses the batch (a value that does not fit its column), each
    event is tried alone in a savepoint and only the refused ones are returned in
    ``refused``, with PostgreSQL's reason.
    """
    newest, superseded = newest_per_entity(events)
    refused: list[Refusal] = []
    try:
        with conn.transaction():
            applied = _write(conn, table, newest)
    except (psycopg.errors.DataError, psycopg.errors.IntegrityError):
        applied = set()
        for event in newest:
            try:
                with conn.transaction():
                    applied |= _write(conn, table, [event])
            except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
                refused.append(Refusal(event, PROJECTION_REJECTED, first_line(exc)))
    return _outcome(newest, superseded, applied, refused)


def apply_alone(conn: Conn, table: ProjectionTable, events: Sequence[Event]) -> Outcome:
    """``apply`` as one statement that is its own transaction (``conn`` in autocommit).

    One round trip instead of five (BEGIN, savepoint, upsert, release, COMMIT). A batch
    the table refuses raises, and changes nothing; ``apply`` then finds the refused events.
    """
    newest, superseded = newest_per_entity(events)
    return _outcome(newest, superseded, _write(conn, table, newest), [])


def _outcome(
    newest: Sequence[Event], superseded: list[Event], applied: set[str], refused: list[Refusal]
) -> Outcome:
    outcome = Outcome(stale=superseded, refused=refused)
    refused_ids = {id(r.event) for r in refused}
    for event in newest:
        if event.entity_id in applied:
            outcome.applied.append(event)
        elif id(event) not in refused_ids:
            outcome.stale.append(event)
    return outcome


class ProjectionApplier:
    """A projection route in the consumer: its table checked once, then one upsert per batch."""

    def __init__(self, route: ProjectionRoute) -> None:
        self.route = route
        self._table: ProjectionTable | None = None

    def connect(self, links: Links) -> None:
        """Check the table (``RoutesError`` if it does not fit) and build the upsert."""
        self._table = check_table(links.conn, self.route)

    def apply(self, conn: Conn, events: Sequence[Event], raw: Mapping[Event, bytes]) -> Outcome:
        """Upsert the newest event of each entity in one transaction.

        When the table refuses an event, or the statement fails, the table is looked at
        again: one an operator changed under the consumer (a column's type, the unique
        index) stops the route with ``TableChangedError``, instead of every event of the
        stream being dead-lettered as bad input.
        """
        if self._table is None:
            raise RuntimeError(f"projection route {self.route.stream} is not connected")
        try:
            outcome = self._apply(conn, events, self._table)
        except psycopg.Error as exc:
            if cause(exc) is not Cause.OUTAGE:  # say which route and what changed
                self._still_fits(conn, self._table)
            raise
        if outcome.refused:
            self._still_fits(conn, self._table)
        return outcome

    def _still_fits(self, conn: Conn, table: ProjectionTable) -> None:
        """``TableChangedError`` when the table changed since it was checked."""
        if conn.info.transaction_status == TransactionStatus.INERROR:
            conn.rollback()
        what = changed(conn, table)
        if what is not None:
            raise TableChangedError(
                f"route {self.route.stream}: table {self.route.table} changed under the "
                f"consumer ({what}); put it back, or change the routes file and restart"
            )

    @staticmethod
    def _apply(conn: Conn, events: Sequence[Event], table: ProjectionTable) -> Outcome:
        if conn.autocommit:
            try:
                return apply_alone(conn, table, events)
            except (psycopg.errors.DataError, psycopg.errors.IntegrityError):
                pass  # some event does not fit the table: find which, one by one
        with conn.transaction():
            return apply(conn, table, events)
