"""A projection's table as the catalog describes it: checked at start-up, and again when it
refuses an event, to tell an operator's change from a bad input."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from consumer.errors import RoutesError
from consumer.kinds._base import Conn
from consumer.kinds.projection.route import ProjectionRoute
from consumer.kinds.projection.upsert import target_columns, upsert_statement


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


def _columns_of(conn: Conn, regclass: int) -> dict[str, str]:
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
        (regclass,),
    ).fetchall()
    return dict(rows)


def _required(conn: Conn, regclass: int) -> set[str]:
    """Columns a new row must be given: NOT NULL, no default, neither identity nor generated."""
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
        "AND NOT attisdropped AND attnotnull AND NOT atthasdef AND attidentity = '' "
        "AND attgenerated = ''",
        (regclass,),
    ).fetchall()
    return {row[0] for row in rows}


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
        for column in target_columns(route)
        if column not in types
    ]
    # A column the upsert leaves out gets its default: without one, no row could be made
    # (in a table several streams feed, another stream's columns must allow NULL).
    problems += [
        f"{where}: table {route.table} column {column!r} is NOT NULL without a default and "
        "the route does not write it, so no new row could be stored; give it a default, "
        "allow NULL (another stream's column, in a table several streams feed) or map it"
        for column in sorted(_required(conn, found[0]) - set(target_columns(route)))
    ]
    conflict = {route.key} | ({route.entity_type_column} if route.entity_type_column else set())
    if conflict not in _unique_keys(conn, found[0]):
        problems.append(
            f"{where}: table {route.table} needs a primary key or unique index on exactly "
            f"({', '.join(sorted(conflict))}) for the upsert"
        )
    if problems:
        raise RoutesError(problems)
    targets = {c: types[c] for c in target_columns(route)}
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
