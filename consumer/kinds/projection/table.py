"""A projection route in the consumer: last writer wins, one upsert per poll batch.

The route is ``route``, its pure decisions and statement ``upsert``, its table's
catalog checks ``catalog``; here is what writes and reads the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from consumer.errors import TableChangedError
from consumer.kinds._base import Applier, Conn
from consumer.kinds._outcome import Outcome, Refusal
from consumer.kinds._resources import Resources
from consumer.kinds.projection.catalog import ProjectionTable, changed, check_table
from consumer.kinds.projection.errors import PROJECTION_REJECTED
from consumer.kinds.projection.route import ProjectionRoute
from consumer.kinds.projection.upsert import newest_per_entity, record
from schemas import Event
from schemas.runtime.causes import Cause, cause
from schemas.runtime.logs import first_line

if TYPE_CHECKING:
    from consumer.settings import RouteSettings


def stored_row(conn: Conn, route: ProjectionRoute, entity_id: str) -> dict[str, Any] | None:
    """What the stream wrote into the entity's row (generation, seq, then its mapped columns);
    None when it wrote nothing (no row, or a row only other streams wrote)."""
    names = [route.generation_column, route.seq_column, *route.columns]
    where, params = _entity(route, entity_id)
    cur = conn.execute(
        sql.SQL("SELECT {} FROM {} WHERE {}").format(
            sql.SQL(", ").join(map(sql.Identifier, names)), route.table_sql, where
        ),
        params,
    )
    row = cur.fetchone()
    if row is None or row[0] is None:
        return None
    return dict(zip(["generation", "seq", *route.columns], row, strict=True))


def whole_row(conn: Conn, route: ProjectionRoute, entity_id: str) -> dict[str, Any] | None:
    """Every column of the entity's row, whichever stream wrote it (None: no row)."""
    where, params = _entity(route, entity_id)
    row = conn.execute(
        sql.SQL("SELECT to_jsonb(t) FROM {} AS t WHERE {}").format(route.table_sql, where),
        params,
    ).fetchone()
    return None if row is None else dict(row[0])


def _entity(route: ProjectionRoute, entity_id: str) -> tuple[sql.Composable, list[Any]]:
    """The WHERE clause, and its parameters, that finds the entity's row."""
    where: sql.Composable = sql.SQL("{}::text = %s").format(sql.Identifier(route.key))
    params: list[Any] = [entity_id]
    if route.entity_type_column:
        where = sql.SQL("{} AND {} = %s").format(where, sql.Identifier(route.entity_type_column))
        params.append(route.stream)
    return where, params


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


class ProjectionApplier(Applier[ProjectionRoute]):
    """A projection route in the consumer: its table checked once, then one upsert per batch."""

    def __init__(self, route: ProjectionRoute) -> None:
        self.route = route
        self._table: ProjectionTable | None = None

    def connect(self, links: Resources[RouteSettings]) -> None:
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
