"""The relay's SQL: read past the cursors, advance them, look up ranges, measure, purge.

Thin I/O only; where a slice stands and how a read moves it is ``frontier``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from typing import Any

import psycopg

from outbox_relay.errors import SchemaNotReadyError, UnsafeClusterError
from outbox_relay.frontier import Cursor, Snapshot
from outbox_relay.rows import COLUMNS, FIELDS, ID, SLICE, TRANSACTION, XID, OutboxRow, Row
from outbox_relay.topics import AWAITING_LIKE
from outbox_relay.weighing import CUT, Bounds, weighed
from schemas.runtime import postgres

Conn = psycopg.Connection[Any]

# One statement, so one snapshot: the rows it returns are exactly those of the
# transactions the snapshot shows finished. The snapshot comes first, alone (in the
# topic's place, with a NULL id); then per slice the rows past the cursor, then the rows
# of remembered transactions past their positions, each part in (xid, id) order and
# limited in rows and in bytes (``_part``). Each row is a ``Row`` followed by its cut
# mark (``weighing``); its slice comes from the cursor, not computed again.
_AFTER_TOPIC = len(OutboxRow._fields) - 2  # the columns after id and topic


def _part(alias: str, where: str, order: str) -> str:
    """One part of a read, past ``where``: at most ``limit`` rows, in index ``order``,
    weighed against the part's ``share`` of the budget."""
    inner = f"""SELECT {FIELDS}, {alias}.slice, {TRANSACTION}, xid AS x8 FROM outbox
 WHERE outbox_slice(entity_type, entity_id) = {alias}.slice AND {where}
 ORDER BY {order} LIMIT %(limit)s"""  # noqa: S608 - constants only; values are parameters
    return weighed(inner, order.replace("xid", "x8"), "share")


_READ = f"""
SELECT NULL::bigint, pg_current_snapshot()::text, {", ".join(["NULL"] * _AFTER_TOPIC)}, false
UNION ALL (
    SELECT o.* FROM unnest(%(slices)s::smallint[],
            %(xids)s::text[]::xid8[], %(ids)s::bigint[]) AS c(slice, x, i)
    CROSS JOIN LATERAL ({_part("c", "(xid, id) > (c.x, c.i)", "xid, id")}) o)
UNION ALL (
    SELECT o.* FROM unnest(%(wslices)s::smallint[],
            %(wxids)s::text[]::xid8[], %(wpos)s::bigint[]) AS w(slice, x, p)
    CROSS JOIN LATERAL ({_part("w", "xid = w.x AND id > w.p", "id")}) o)
"""  # noqa: S608 - the columns are constants, values are parameters

# One entity generation's rows in a seq range: the rows still to send, weighed against
# the budget in seq order, then every row of the range marked failed or set aside (its
# seq, and whether it failed).
_RANGE_WHERE = (
    "entity_type = %(type)s AND entity_id = %(id)s AND generation = %(generation)s"
    " AND seq BETWEEN %(from)s AND %(to)s"
)
_RANGE = f"""
SELECT r.*, false FROM ({
    weighed(
        f"SELECT {COLUMNS} FROM outbox WHERE {_RANGE_WHERE} AND failed_at IS NULL ORDER BY seq",
        "seq",
        "budget",
    )
}) r
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, seq, {", ".join(["NULL"] * (CUT - 6))}, false,
       failure_reason NOT LIKE %(aside)s
  FROM outbox WHERE {_RANGE_WHERE} AND failed_at IS NOT NULL
"""  # noqa: S608 - the columns are constants, values are parameters

_SAVE_CURSORS = """
UPDATE outbox_relay_slices s
   SET cursor_xid = n.x, cursor_id = n.i, running = n.r::xid8[], running_pos = n.p::bigint[],
       lease_until = now() + make_interval(secs => %(lease_s)s), advanced_at = now()
  FROM unnest(%(slices)s::smallint[], %(xids)s::text[]::xid8[], %(ids)s::bigint[],
              %(running)s::text[], %(pos)s::text[]) AS n(slice, x, i, r, p)
 WHERE s.slice = n.slice AND s.owner = %(owner)s
RETURNING s.slice
"""


def connect(url: str, *, reading: bool = False) -> Conn:
    """An autocommit connection that reads rows as the relay expects (JSON by orjson).

    ``reading``: the connection that runs ``read`` and nothing else. A read must walk
    each slice's index in (xid, id) order and stop at its limit. Where PostgreSQL has no
    statistics on the slice expression yet (a new outbox, or one just given the index by
    the upgrade, until it is analysed), it guesses a slice at a few rows and plans to
    fetch and sort all of them instead: on a 100,000-row backlog that read took 530 ms
    instead of 54. This connection rules sorts out, so the index order is the only plan
    left. Ruling them out prices any plan that still sorts past the point where
    PostgreSQL compiles it first (JIT), which took 1.8 s for a 50 ms read: compiling is
    off here too. Both are set by statements, not start-up options, which poolers may
    refuse.
    """
    conn = postgres.connect(url, "inorder-relay")
    if reading:
        try:
            conn.execute("SET enable_sort TO off")
            conn.execute("SET jit TO off")
        except BaseException:
            conn.close()
            raise
    return conn


@dataclass(slots=True)
class Read:
    """What one read returned: its snapshot, and per slice its rows in ``(xid, id)`` order.

    Each row is a ``Row``: OutboxRow's values, not yet named. ``cut``: slices whose rows
    the byte budget cut short (more rows follow the last one returned).
    """

    snapshot: Snapshot
    rows: dict[int, list[Row]] = field(default_factory=dict)
    cut: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class SliceBacklog:
    """One slice's unsent rows, the age of the oldest, and its remembered transactions."""

    rows: int
    oldest_age_s: float
    running: int
    oldest_running_age_s: float


def check_schema(conn: Conn) -> None:
    """Raise ``SchemaNotReadyError`` unless the outbox has the cursor tables the relay uses."""
    row = conn.execute("SELECT to_regclass('outbox_relay_slices') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        raise SchemaNotReadyError(
            "the outbox table is missing or out of date; run `inorder-producer migrate`"
        )


def check_cluster(conn: Conn) -> None:
    """Raise ``UnsafeClusterError`` on a standby, or when the outbox's ids run ahead of it."""
    row = conn.execute(
        "SELECT pg_is_in_recovery(), pg_snapshot_xmax(pg_current_snapshot())::text, "
        " (SELECT max(xid)::text FROM ("
        "   SELECT (SELECT xid FROM outbox WHERE outbox_slice(entity_type, entity_id) = s"
        "            ORDER BY xid DESC LIMIT 1) AS xid FROM generate_series(0, 15) s"
        "   UNION ALL SELECT cursor_xid FROM outbox_relay_slices) t)"
    ).fetchone()
    assert row is not None
    standby, xmax, highest = row
    if standby:
        raise UnsafeClusterError(
            "the database is a standby; point DATABASE_URL at the primary (transaction ids "
            "and snapshots on a standby do not order the primary's writes)"
        )
    if highest is not None and int(highest) >= int(xmax):
        raise UnsafeClusterError(
            f"the outbox holds transaction id {highest}, ahead of this cluster's {xmax} "
            "(restored from a logical dump into another cluster?); new rows would sort behind "
            "the cursors and never be sent; with no relay running, rebase the outbox once: "
            "psql -1 -f schemas/outbox/rebase_xids.sql (outbox_relay/README.md, Primary only)"
        )


def read(conn: Conn, cursors: Mapping[int, Cursor], bounds: Bounds) -> Read:
    """Rows past the cursors of ``cursors``' slices, within ``bounds``.

    Each part of the read (a slice past its cursor, a remembered transaction past its
    position) gets an equal share of the byte budget. Where a part was cut, its slice's
    rows end at the cut: the slice's rows stay one unbroken run in ``(xid, id)`` order,
    which is what the cursor may pass.
    """
    params: dict[str, Any] = _cursor_params(cursors)
    waiting = [(s, x, p) for s in params["slices"] for x, p in cursors[s].running.items()]
    params |= {
        "wslices": [w[0] for w in waiting],
        "wxids": [str(w[1]) for w in waiting],
        "wpos": [w[2] for w in waiting],
        "share": max(1, bounds.bytes // max(1, len(cursors) + len(waiting))),
    } | bounds.params()
    records = conn.execute(_READ, params, prepare=True).fetchall()
    snapshot = next(record for record in records if record[ID] is None)
    result = Read(Snapshot.parse(snapshot[1]))
    data = (record for record in records if record[ID] is not None)
    for slice_, group in groupby(data, itemgetter(SLICE)):
        result.rows.setdefault(slice_, []).extend(group)
    marks: dict[int, tuple[int, int]] = {}
    for slice_, rows in result.rows.items():
        for mark in filter(itemgetter(CUT), rows):  # at most one per part
            at = (mark[XID], mark[ID])
            marks[slice_] = min(marks.get(slice_, at), at)
    for slice_ in {w[0] for w in waiting} & result.rows.keys():
        rows = sorted(result.rows[slice_], key=itemgetter(XID, ID))  # both parts may have rows
        if slice_ in marks:
            rows = [row for row in rows if (row[XID], row[ID]) <= marks[slice_]]
        result.rows[slice_] = rows
    result.cut = set(marks)
    return result


def save_cursors(conn: Conn, owner: str, cursors: Mapping[int, Cursor], lease_s: float) -> set[int]:
    """Store the cursors of slices ``owner`` still holds, renewing their leases; those stored."""
    params = _cursor_params(cursors) | {"owner": owner, "lease_s": lease_s}
    return {row[0] for row in conn.execute(_SAVE_CURSORS, params, prepare=True)}


def _cursor_params(cursors: Mapping[int, Cursor]) -> dict[str, list[Any]]:
    """The cursors as parallel arrays, by slice: the form every statement unnests."""
    slices = sorted(cursors)
    return {
        "slices": slices,
        "xids": [str(cursors[s].xid) for s in slices],
        "ids": [cursors[s].id for s in slices],
        "running": [_array(cursors[s].running.keys()) for s in slices],
        "pos": [_array(cursors[s].running.values()) for s in slices],
    }


def _array(values: Any) -> str:
    return "{" + ",".join(str(v) for v in values) + "}"


def mark_failed(conn: Conn, row_id: int, reason: str) -> None:
    """Record why a row can never be sent; the cursor then passes it (the rare per-row write)."""
    conn.execute(
        "UPDATE outbox SET failed_at = now(), failure_reason = %s WHERE id = %s", (reason, row_id)
    )


@dataclass(frozen=True, slots=True)
class Range:
    """What one range read found: rows to send, seqs marked failed or set aside, in seq order.

    ``through``: the last seq the read covers when the budget cut it short (the rest of
    the range is for another read), else None.
    """

    rows: list[OutboxRow]
    failed: list[int]
    through: int | None
    aside: list[int] = field(default_factory=list)  # seqs set aside until their topic exists


def rows_in_range(
    conn: Conn,
    key: tuple[str, str, int, int, int],
    bounds: Bounds,
) -> Range:
    """Rows of one entity generation with seq in the range ``key``, within ``bounds``' bytes."""
    entity_type, entity_id, generation, from_seq, to_seq = key
    params = {
        "type": entity_type,
        "id": entity_id,
        "generation": generation,
        "from": from_seq,
        "to": to_seq,
        "aside": AWAITING_LIKE,
    } | bounds.params()
    rows: list[OutboxRow] = []
    failed: list[int] = []
    aside: list[int] = []
    cut = False
    for record in conn.execute(_RANGE, params):
        if record[0] is not None:
            rows.append(OutboxRow._make(record[:CUT]))
            cut = cut or record[CUT]
        else:
            (failed if record[-1] else aside).append(record[5])
    rows.sort(key=lambda row: row.seq)
    through = rows[-1].seq if cut else None
    if through is not None:
        failed = [seq for seq in failed if seq <= through]
        aside = [seq for seq in aside if seq <= through]
    return Range(rows, sorted(failed), through, sorted(aside))


_BACKLOG = """
SELECT c.slice,
       (SELECT count(*) FROM outbox
         WHERE outbox_slice(entity_type, entity_id) = c.slice AND (xid, id) > (c.x, c.i))
     + (SELECT count(*) FROM outbox
         WHERE outbox_slice(entity_type, entity_id) = c.slice AND xid = ANY(c.r::xid8[])),
       coalesce(extract(epoch FROM now() - (
           SELECT created_at FROM outbox
            WHERE outbox_slice(entity_type, entity_id) = c.slice AND (xid, id) > (c.x, c.i)
            ORDER BY xid, id LIMIT 1)), 0),
       (SELECT coalesce(extract(epoch FROM now() - min(a.xact_start)), 0)
          FROM pg_stat_activity a WHERE a.backend_xid = ANY(c.r::xid8[]::xid[]))
  FROM unnest(%(slices)s::smallint[], %(xids)s::text[]::xid8[], %(ids)s::bigint[],
              %(running)s::text[]) AS c(slice, x, i, r)
"""


def backlog(conn: Conn, cursors: Mapping[int, Cursor]) -> dict[int, SliceBacklog]:
    """How far behind each of these slices is, and how old its remembered transactions are.

    Every part is an index range of the slice (the first row past the cursor is taken
    as the oldest waiting), so measuring costs the backlog, not the table.
    """
    found = conn.execute(_BACKLOG, _cursor_params(cursors)).fetchall()
    return {
        s: SliceBacklog(int(n), float(age), len(cursors[s].running), float(running_age))
        for s, n, age, running_age in found
    }


def failed_rows(conn: Conn) -> tuple[int, int]:
    """Rows marked failed, waiting for a person; rows set aside, waiting for their topic."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE failure_reason NOT LIKE %(aside)s),"
        " count(*) FILTER (WHERE failure_reason LIKE %(aside)s)"
        " FROM outbox WHERE failed_at IS NOT NULL",
        {"aside": AWAITING_LIKE},
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def purge_batch(conn: Conn, after_id: int, retention_s: float, limit: int) -> tuple[int, int, bool]:
    """Delete sent rows older than ``retention_s`` among the next ``limit`` rows past ``after_id``.

    Rows are looked at in id order, which is the order they were written in; rows marked
    failed and rows not yet sent stay (``outbox_published``). Returns the rows deleted,
    the last id looked at, and whether a row too young to go was met (nothing behind it
    is old enough either, so the walk can stop).
    """
    row = conn.execute(
        "WITH seen AS (SELECT id, created_at >= now() - make_interval(secs => %(r)s) AS young"
        "   FROM outbox WHERE id > %(after)s ORDER BY id LIMIT %(limit)s),"
        " gone AS (DELETE FROM outbox o USING seen"
        "   WHERE o.id = seen.id AND NOT seen.young AND outbox_published(o) RETURNING 1)"
        " SELECT (SELECT count(*) FROM gone), (SELECT max(id) FROM seen),"
        "  (SELECT coalesce(bool_or(young), true) FROM seen)",
        {"r": retention_s, "after": after_id, "limit": limit},
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1] or after_id), bool(row[2])


def cursor_from(xid: str, row_id: int, running: Sequence[str], positions: Sequence[int]) -> Cursor:
    """A cursor as stored in ``outbox_relay_slices``."""
    return Cursor(int(xid), row_id, dict(zip((int(x) for x in running), positions, strict=True)))
