"""A Debezium outbox table, read for republish requests: one entity's rows in a seq range.

The table is the user's: its name and columns are settings (the router's own), checked
once at start-up. Rows are read weighed, as the relay reads its own outbox: at most the
read budget of payload text per request (the first row whatever it weighs), and a row
longer than the largest message is not loaded at all (it could never be sent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from outbox_relay.errors import RelayError
from outbox_relay.settings import RelaySettings
from schemas.errors import OperatorError

Conn = psycopg.Connection[Any]


class ForeignTableError(RelayError, OperatorError):
    """The Debezium outbox table, or a column the settings name, is not there."""


@dataclass(frozen=True, slots=True)
class Found:
    """An entity's rows in a range: those loaded (by column name), the seqs too long to load,
    and the last seq the budget let in when it cut the range short (None: all of it)."""

    rows: list[dict[str, Any]]
    too_large: list[int]
    through: int | None


class ForeignTable:
    """Where inorder's fields are in the user's outbox table, and the statement that reads it."""

    def __init__(self, settings: RelaySettings) -> None:
        self.shape = settings.debezium_shape()
        self.fields = settings.debezium_fields()
        self.name = settings.debezium_table
        self.table = settings.debezium_table_sql()
        self.columns = self.fields.columns(self.shape)
        self.seq = self.shape.seq_field
        self.generation = self.shape.generation_field
        self.budget = settings.read_bytes
        self.max_row = settings.max_message_bytes
        self._read = self._statement()

    def check(self, conn: Conn) -> None:
        """``ForeignTableError`` naming what is missing, read from the catalog."""
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL("SELECT {} FROM {} LIMIT 0").format(
                        sql.SQL(", ").join(map(sql.Identifier, self._needed())), self.table
                    )
                )
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
            raise ForeignTableError(
                f"the Debezium outbox table {self.name}: {str(exc).splitlines()[0]}; set "
                "INORDER_DEBEZIUM_TABLE and the INORDER_DEBEZIUM_*_FIELD settings to its "
                "names"
            ) from None

    def _needed(self) -> list[str]:
        return list(
            dict.fromkeys(
                [*self.columns, self.seq, *([self.generation] if self.generation else [])]
            )
        )

    def _statement(self) -> sql.Composed:
        cols = sql.SQL(", ").join(
            sql.SQL("CASE WHEN loaded THEN t.{0} END").format(sql.Identifier(c))
            if c == self.fields.payload
            else sql.SQL("t.{}").format(sql.Identifier(c))
            for c in self.columns
        )
        version = (
            sql.SQL("AND t.{} = %(generation)s").format(sql.Identifier(self.generation))
            if self.generation
            else sql.SQL("")
        )
        return sql.SQL(
            "SELECT {cols}, t.{seq}, loaded, coalesce(upto + next_weight > %(budget)s, false) "
            "FROM (SELECT t.*, w.loaded, sum(w.weight) OVER o AS upto, "
            "             lead(w.weight) OVER o AS next_weight, row_number() OVER o AS n "
            "        FROM {table} t, "
            "             LATERAL (SELECT octet_length(t.{payload}::text) AS bytes) b, "
            "             LATERAL (SELECT b.bytes <= %(max_row)s AS loaded, "
            "                      CASE WHEN b.bytes <= %(max_row)s THEN b.bytes ELSE 0 END "
            "                      + 64 AS weight) w "
            "       WHERE t.{route}::text = %(stream)s AND t.{key}::text = %(entity)s "
            "         AND t.{seq} BETWEEN %(from)s AND %(to)s {version} "
            "      WINDOW o AS (ORDER BY t.{seq}, t.{id} ROWS UNBOUNDED PRECEDING)) t "
            "WHERE upto <= %(budget)s OR n = 1 ORDER BY t.{seq}, t.{id}"
        ).format(
            cols=cols,
            seq=sql.Identifier(self.seq),
            table=self.table,
            payload=sql.Identifier(self.fields.payload),
            route=sql.Identifier(self.shape.route_by_field),
            key=sql.Identifier(self.fields.key),
            id=sql.Identifier(self.fields.id),
            version=version,
        )

    def rows_in_range(
        self, conn: Conn, stream: str, entity_id: str, generation: int, seqs: Sequence[int]
    ) -> Found:
        """The entity's rows with seq from ``seqs[0]`` to ``seqs[-1]``, weighed.

        A table without a generation column holds generation 1 only: a request for
        another finds nothing.
        """
        if not self.generation and generation != 1:
            return Found([], [], None)
        params = {
            "stream": stream,
            "entity": entity_id,
            "generation": generation,
            "from": seqs[0],
            "to": seqs[-1],
            "budget": self.budget,
            "max_row": self.max_row,
        }
        rows: list[dict[str, Any]] = []
        too_large: list[int] = []
        cut = False
        width = len(self.columns)
        for record in conn.execute(self._read, params):
            seq, loaded, past = record[width], record[width + 1], record[width + 2]
            cut = cut or past
            if loaded:
                rows.append(dict(zip(self.columns, record[:width], strict=True)) | {"seq": seq})
            else:
                too_large.append(int(seq))
        last = max([int(r["seq"]) for r in rows] + too_large, default=None)
        return Found(rows, too_large, last if cut else None)
