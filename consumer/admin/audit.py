"""The audit: the outbox (the producer's truth) against what the consumer made of it.

Projection routes: each entity's table row must hold the newest outbox event's
(generation, seq) and column values. Step routes: every outbox seq of an entity must
be in the step log once, unless a person skipped it. Both sides are streamed with
server-side cursors in byte order of the entity id and merged entity by entity, so
memory stays bounded. Each divergence gets its likely cause; only unexplained ones
make the audit fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count, groupby
from typing import Any

import psycopg
from psycopg import sql

from consumer.kinds.projection import ProjectionRoute, field_value
from consumer.kinds.steps import StepRoute
from consumer.routes import Route
from consumer.sweeper.gaps import UNRESOLVED

Conn = psycopg.Connection[Any]
_names = count()


@dataclass(frozen=True, slots=True)
class Divergence:
    """One place where the consumer's state differs from the outbox."""

    route: str
    entity_id: str
    detail: str
    cause: str | None  # None: unexplained


@dataclass(slots=True)
class Report:
    """What the audit found."""

    entities: int = 0
    rows: int = 0
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def unexplained(self) -> list[Divergence]:
        """Divergences no known state accounts for."""
        return [d for d in self.divergences if d.cause is None]


def _stream(
    conn: Conn, query: sql.SQL | sql.Composed, params: Sequence[Any]
) -> Iterator[tuple[Any, ...]]:
    with conn.cursor(name=f"audit_{next(_names)}") as cur:
        cur.itersize = 2000
        cur.execute(query, params)
        yield from cur


def _merge(
    left: Iterator[tuple[Any, ...]], right: Iterator[tuple[Any, ...]]
) -> Iterator[tuple[str, list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """Group two entity-ordered row streams by entity id (column 0) and pair the groups."""
    lgroups = ((k, list(g)) for k, g in groupby(left, key=lambda r: r[0]))
    rgroups = ((k, list(g)) for k, g in groupby(right, key=lambda r: r[0]))
    lnext, rnext = next(lgroups, None), next(rgroups, None)
    while lnext is not None or rnext is not None:
        lkey = lnext[0] if lnext else None
        rkey = rnext[0] if rnext else None
        if rkey is None or (lkey is not None and lkey.encode() < rkey.encode()):
            yield lkey, lnext[1], []  # type: ignore[misc, index]
            lnext = next(lgroups, None)
        elif lkey is None or rkey.encode() < lkey.encode():
            yield rkey, [], rnext[1]  # type: ignore[index]
            rnext = next(rgroups, None)
        else:
            yield lkey, lnext[1], rnext[1]  # type: ignore[index]
            lnext, rnext = next(lgroups, None), next(rgroups, None)


class Audit:
    """Runs the checks over one outbox connection and one consumer connection."""

    def __init__(
        self,
        outbox: Conn,
        consumer: Conn,
        tick: Callable[[], None] = lambda: None,
        only: str | None = None,
    ) -> None:
        self.outbox = outbox
        self.consumer = consumer
        self.tick = tick
        # One entity id to audit (inorder-admin explain), or None for every entity.
        self.only = only
        self.report = Report()
        # What each route kind's tables must agree with the outbox on.
        self._checks: dict[str, Callable[[Any], None]] = {
            "projection": self._projection,
            "step": self._steps,
        }

    def run(self, routes: Sequence[Route]) -> Report:
        """Audit every route, each side read in one transaction (server-side cursors)."""
        with self.outbox.transaction(), self.consumer.transaction():
            for route in routes:
                check = self._checks.get(route.kind)
                if check is not None:  # batch routes are judged by their manifests
                    check(route)
        return self.report

    def _diverge(self, route: str, entity: str, detail: str, cause: str | None) -> None:
        self.report.divergences.append(Divergence(route, entity, detail, cause))

    # ------------------------------------------------------------------ projections

    def _projection(self, route: ProjectionRoute) -> None:
        newest = _stream(
            self.outbox,
            sql.SQL(
                'SELECT DISTINCT ON (entity_id COLLATE "C") entity_id, generation, seq, payload, '
                "NOT outbox_published(outbox), failure_reason FROM outbox WHERE entity_type = %s "
                "AND (%s::text IS NULL OR entity_id = %s) "
                'ORDER BY entity_id COLLATE "C", generation DESC, seq DESC'
            ),
            (route.stream, self.only, self.only),
        )
        table = route.table_sql
        columns = sql.SQL(", ").join(
            sql.SQL("to_jsonb({})").format(sql.Identifier(c)) for c in route.columns
        )
        key, gen, seq = (
            sql.Identifier(c) for c in (route.key, route.generation_column, route.seq_column)
        )
        stored = _stream(
            self.consumer,
            sql.SQL(
                "SELECT {key}::text, {gen}, {seq}, {columns} FROM {table} "
                "WHERE %s::text IS NULL OR {key}::text = %s "
                'ORDER BY {key}::text COLLATE "C"'
            ).format(key=key, gen=gen, seq=seq, columns=columns, table=table),
            (self.only, self.only),
        )
        for entity, events, rows in _merge(newest, stored):
            self.report.entities += 1
            self.report.rows += len(events) + len(rows)
            self.tick()
            self._compare(route, entity, events[0] if events else None, rows[0] if rows else None)

    def _compare(self, route: ProjectionRoute, entity: str, event: Any, row: Any) -> None:
        if event is None:
            self._diverge(
                route.stream, entity, "row has no event in the outbox", "purged from the outbox"
            )
            return
        _, generation, seq, payload, _, _ = event
        if row is None:
            detail = f"no row; newest event is {generation}/{seq}"
        elif (row[1], row[2]) != (generation, seq):
            detail = f"row at {row[1]}/{row[2]}, newest event {generation}/{seq}"
        else:
            for column, path, value in zip(
                route.columns, route.columns.values(), row[3:], strict=True
            ):
                expected = field_value(payload, path)
                if value != expected:
                    detail = f"column {column} is {value!r}, event says {expected!r}"
                    self._diverge(route.stream, entity, detail, None)
            return
        self._diverge(route.stream, entity, detail, self._projection_cause(route, entity, event))

    def _projection_cause(self, route: ProjectionRoute, entity: str, event: Any) -> str | None:
        """Why a row lags its newest event (looked up only when it does)."""
        _, generation, seq, _, unpublished, failure = event
        if failure:  # a failed row is never published: the failure is the cause
            return f"outbox row failed: {failure}"
        if unpublished:
            return "not published yet"
        return self._dead_letter(route.stream, entity, generation, seq)

    # ------------------------------------------------------------------ steps

    def _steps(self, route: StepRoute) -> None:
        sent = _stream(
            self.outbox,
            sql.SQL(
                "SELECT entity_id, generation, seq, NOT outbox_published(outbox), failure_reason "
                "FROM outbox WHERE entity_type = %s AND (%s::text IS NULL OR entity_id = %s) "
                'ORDER BY entity_id COLLATE "C", generation, seq'
            ),
            (route.stream, self.only, self.only),
        )
        applied = _stream(
            self.consumer,
            sql.SQL(
                "SELECT l.entity_id, l.generation, l.seq, p.generation, p.last_applied "
                "FROM inorder_step_log l JOIN inorder_step_progress p "
                "ON p.route = l.route AND p.entity_id = l.entity_id WHERE l.route = %s "
                "AND (%s::text IS NULL OR l.entity_id = %s) "
                'ORDER BY l.entity_id COLLATE "C", l.generation, l.seq'
            ),
            (route.stream, self.only, self.only),
        )
        for entity, events, logged in _merge(sent, applied):
            self.report.entities += 1
            self.report.rows += len(events) + len(logged)
            self.tick()
            done = {(row[1], row[2]) for row in logged}
            missing = [e for e in events if (e[1], e[2]) not in done]
            if missing:
                self._explain_missing(route.stream, entity, missing)
            if logged:
                _, log_gen, log_seq, gen, last = logged[-1]
                if (gen, last) < (log_gen, log_seq):
                    detail = f"progress {gen}/{last} is behind the log's {log_gen}/{log_seq}"
                    self._diverge(route.stream, entity, detail, None)

    def entities(self, routes: Sequence[Route]) -> int:
        """How many entities the audit will go through (for a progress bar)."""
        streams = [r.stream for r in routes]
        row = self.outbox.execute(
            "SELECT count(DISTINCT (entity_type, entity_id)) FROM outbox "
            "WHERE entity_type = ANY(%s)",
            (streams,),
        ).fetchone()
        return int(row[0]) if row else 0

    def _dead_letter(self, stream: str, entity: str, generation: int, seq: int) -> str | None:
        row = self.consumer.execute(
            "SELECT reason FROM inorder_dead_letters WHERE entity_type = %s AND entity_id = %s "
            "AND generation = %s AND seq = %s LIMIT 1",
            (stream, entity, generation, seq),
        ).fetchone()
        return f"dead-lettered: {row[0]}" if row else None

    def _explain_missing(self, route: str, entity: str, missing: list[tuple[Any, ...]]) -> None:
        state = self.consumer.execute(
            "SELECT p.generation, p.held_at IS NOT NULL, p.stopped_at_seq, p.stop_reason, "
            "(SELECT status || ' ' || from_seq || '..' || to_seq FROM inorder_gaps g "
            " WHERE g.route = p.route AND g.entity_id = p.entity_id AND g.status = ANY(%s)) "
            "FROM inorder_step_progress p WHERE p.route = %s AND p.entity_id = %s",
            (UNRESOLVED, route, entity),
        ).fetchone()
        skips = self.consumer.execute(
            "SELECT generation, from_seq, to_seq FROM inorder_step_skips WHERE route = %s "
            "AND entity_id = %s",
            (route, entity),
        ).fetchall()
        for _, generation, seq, unpublished, failure in missing:
            if any(g == generation and a <= seq <= b for g, a, b in skips):
                continue  # a person decided these seqs will never come
            cause = _step_cause(state, generation, seq, unpublished, failure)
            cause = cause or self._dead_letter(route, entity, generation, seq)
            self._diverge(route, entity, f"seq {generation}/{seq} not applied", cause)


def _step_cause(
    state: Any, generation: int, seq: int, unpublished: bool, failure: str | None
) -> str | None:
    """The first known state that accounts for a step not applied, or None."""
    current, held, stopped_at, reason, gap = state or (generation, False, None, None, None)
    causes = [
        # A newer generation's seq 1 arrived first and started the entity over.
        (generation < current, f"generation {generation} superseded by re-creation ({current})"),
        (bool(failure), f"outbox row failed: {failure}"),
        (unpublished, "not published yet"),
        (
            stopped_at is not None and stopped_at <= seq,
            f"stopped for review at {stopped_at}: {reason}",
        ),
        (gap is not None, f"gap {gap}"),
        (bool(held), "entity held"),
    ]
    return next((text for applies, text in causes if applies), None)
