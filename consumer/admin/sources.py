"""The outbox ``audit`` and ``explain`` compare against, as one relation of inorder's columns.

Events may come from inorder's own outbox, from a Debezium outbox table (the streams on
INORDER_DEBEZIUM_TOPICS), or both. Either is read as a relation named ``outbox`` with
inorder's columns (``id``, ``entity_type``, ``entity_id``, ``generation``, ``seq``,
``event_type``, ``event_id``, ``payload``, ``headers``, ``created_at``, ``failure_reason``)
and ``unsent``: a row inorder's relay has not published. Debezium keeps its position to
itself, so its rows count as sent, and none is ever failed.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from consumer.kinds._audit import INORDER_ROWS
from consumer.settings import RouteSettings

Conn = psycopg.Connection[Any]


def _debezium(settings: RouteSettings) -> sql.Composed:
    shape, fields = settings.debezium_shape(), settings.debezium_fields()
    generation = (
        sql.SQL("t.{}::bigint").format(sql.Identifier(shape.generation_field))
        if shape.generation_field
        else sql.SQL("1::bigint")
    )
    return sql.SQL(
        "SELECT t.{id}::text AS id, t.{route}::text AS entity_type, t.{key}::text AS entity_id, "
        "{generation} AS generation, t.{seq}::bigint AS seq, t.{type}::text AS event_type, "
        "t.{id}::text AS event_id, t.{payload}::jsonb AS payload, NULL::jsonb AS headers, "
        "NULL::timestamptz AS created_at, NULL::text AS failure_reason, false AS unsent "
        "FROM {table} t"
    ).format(
        id=sql.Identifier(fields.id),
        route=sql.Identifier(shape.route_by_field),
        key=sql.Identifier(fields.key),
        generation=generation,
        seq=sql.Identifier(shape.seq_field),
        type=sql.Identifier(shape.type_field),
        payload=sql.Identifier(fields.payload),
        table=settings.debezium_table_sql(),
    )


def _found(conn: Conn, name: sql.Composable) -> int | None:
    row = conn.execute("SELECT to_regclass(%s)::oid", (name.as_string(conn),)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def outbox_rows(conn: Conn, settings: RouteSettings) -> sql.Composed:
    """The outbox as a relation named ``outbox``: inorder's table where it exists, and the
    Debezium table where Debezium topics are consumed (both, each row once)."""
    mine = _found(conn, sql.Identifier("outbox"))
    parts: list[sql.Composable] = [INORDER_ROWS] if mine is not None else []
    if settings.debezium_topics:
        theirs = _found(conn, settings.debezium_table_sql())
        if theirs is not None and theirs != mine:
            parts.append(_debezium(settings))
        elif theirs is None:
            raise psycopg.errors.UndefinedTable(
                f'relation "{settings.debezium_table}" does not exist (INORDER_DEBEZIUM_TABLE)'
            )
    if not parts:
        raise psycopg.errors.UndefinedTable('relation "outbox" does not exist')
    return sql.SQL("({}) AS outbox").format(sql.SQL(" UNION ALL ").join(parts))
