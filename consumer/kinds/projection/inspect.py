"""A projection's part of ``inorder-admin``: its row for ``explain``, its check for ``audit``.

The audit: each entity's row must hold the newest outbox event's ``(generation, seq)``
and column values; a row that lags is explained by the newest event's state (failed,
not published yet, dead-lettered) or left unexplained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psycopg import sql

from consumer.kinds._audit import Audit
from consumer.kinds._plugin import Conn, Findings
from consumer.kinds._resources import Resources
from consumer.kinds.projection.route import ProjectionRoute
from consumer.kinds.projection.table import stored_row, whole_row
from consumer.kinds.projection.upsert import field_value, target_columns
from schemas.snapshot import snapshot_type

if TYPE_CHECKING:
    from consumer.settings import SweeperSettings


class ProjectionInspector:
    """What a projection route shows an operator."""

    def generation(self, conn: Conn, route: ProjectionRoute, entity_id: str) -> int | None:
        """The generation of the entity's row (None: no row)."""
        row = stored_row(conn, route, entity_id)
        return None if row is None else int(row["generation"])

    def story(
        self, tools: Resources[SweeperSettings], route: ProjectionRoute, entity_id: str
    ) -> Findings:
        """What the stream wrote into the entity's row; the whole row too when it holds more
        (other streams' columns and versions, in a table several streams feed)."""
        found = Findings(applied=stored_row(tools.conn, route, entity_id))
        row = whole_row(tools.conn, route, entity_id)
        if row is not None and set(row) - set(target_columns(route)):
            found.sections["row"] = (f"The whole row in {route.table}, every source", [row])
        return found

    def audit(self, audit: Audit, route: ProjectionRoute) -> None:
        """Each entity's row against its newest outbox event (or that version's snapshot)."""
        snapshot = snapshot_type(route.stream)
        newest = audit.stream(
            audit.outbox,
            sql.SQL(
                'SELECT DISTINCT ON (entity_id COLLATE "C") entity_id, generation, seq, payload, '
                "unsent, failure_reason, event_type = %s "
                "FROM {} WHERE entity_type = %s AND (%s::text IS NULL OR entity_id = %s) "
                # The change event of the newest version first; its snapshot when it is gone.
                'ORDER BY entity_id COLLATE "C", generation DESC, seq DESC, event_type = %s'
            ).format(audit.source),
            (snapshot, route.stream, audit.only, audit.only, snapshot),
        )
        columns = sql.SQL(", ").join(
            sql.SQL("to_jsonb({})").format(sql.Identifier(c)) for c in route.columns
        )
        key, gen, seq = (
            sql.Identifier(c) for c in (route.key, route.generation_column, route.seq_column)
        )
        stored = audit.stream(
            audit.consumer,
            sql.SQL(
                # Only the rows this stream wrote: in a table several streams feed, a row
                # another stream created holds none of its versions.
                "SELECT {key}::text, {gen}, {seq}, {columns} FROM {table} "
                "WHERE {gen} IS NOT NULL AND {own} AND (%s::text IS NULL OR {key}::text = %s) "
                'ORDER BY {key}::text COLLATE "C"'
            ).format(
                key=key,
                gen=gen,
                seq=seq,
                columns=columns,
                table=route.table_sql,
                own=(
                    sql.SQL("{} = {}").format(
                        sql.Identifier(route.entity_type_column), sql.Literal(route.stream)
                    )
                    if route.entity_type_column
                    else sql.SQL("true")
                ),
            ),
            (audit.only, audit.only),
        )
        for entity, events, rows in audit.entity_pairs(newest, stored):
            _compare(audit, route, entity, events[0] if events else None, rows[0] if rows else None)


def _compare(audit: Audit, route: ProjectionRoute, entity: str, event: Any, row: Any) -> None:
    if event is None:
        audit.diverge(
            route.stream, entity, "row has no event in the outbox", "purged from the outbox"
        )
        return
    _, generation, seq, payload, _, _, from_snapshot = event
    if row is None:
        detail = f"no row; newest event is {generation}/{seq}"
    elif (row[1], row[2]) != (generation, seq):
        detail = f"row at {row[1]}/{row[2]}, newest event {generation}/{seq}"
    else:
        for column, path, value in zip(route.columns, route.columns.values(), row[3:], strict=True):
            expected = field_value(payload, path)
            if value != expected:
                audit.diverge(
                    route.stream,
                    entity,
                    f"column {column} is {value!r}, event says {expected!r}",
                    None,
                )
        if from_snapshot:
            audit.healed(route.stream, entity)
        return
    audit.diverge(route.stream, entity, detail, _cause(audit, route, entity, event))


def _cause(audit: Audit, route: ProjectionRoute, entity: str, event: Any) -> str | None:
    """Why a row lags its newest event (looked up only when it does)."""
    _, generation, seq, _, unpublished, failure, _ = event
    if failure:  # a failed row is never published: the failure is the cause
        return f"outbox row failed: {failure}"
    if unpublished:
        return "not published yet"
    return audit.dead_letter(route.stream, entity, generation, seq)
