"""``check_order_independence``: the same rows whatever order, repeats and batches events come in.

Each arrival order runs in a PostgreSQL schema of its own (and Redis keys of its own),
created for it and dropped after, so orders never see each other's rows. Hypothesis
draws the orders (seeded) and shrinks a failure to the smallest arrival it can find.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from psycopg import sql

from consumer.errors import ConsumerError
from consumer.kinds import KINDS, Kind, Route
from consumer.testing._driver import RouteDriver
from consumer.testing._scratch import scratch
from schemas import Event
from schemas.runtime.redis_client import RedisClient

Setup = Callable[[psycopg.Connection[Any]], None]
Arrival = list[list[int]]  # poll batches of indexes into the events given


class OrderDependenceError(ConsumerError, AssertionError):
    """Raised when some arrival order leaves other rows than the events applied in order."""


@st.composite
def arrivals(draw: st.DrawFn, count: int, *, duplicates: bool = True) -> Arrival:
    """An arrival of ``count`` events: any order, some sent twice, cut into poll batches.

    Shrinks towards the events in order, no duplicates, one batch.
    """
    order = list(draw(st.permutations(range(count))))
    if duplicates and count:
        for again in draw(st.lists(st.integers(0, count - 1), max_size=count)):
            order.insert(draw(st.integers(0, len(order))), again)
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(order) - 1)), max_size=len(order))))
    bounds = [0, *(c for c in cuts if c < len(order)), len(order)]
    return [order[a:b] for a, b in pairwise(bounds) if b > a]


class _Run:
    """What one arrival needs: a fresh schema, the user's tables, the driver, the rows read."""

    def __init__(
        self,
        database_url: str,
        routes: Sequence[Route] | str | Path,
        setup: Setup,
        client: RedisClient | None,
        kinds: Mapping[str, Kind],
    ) -> None:
        self.database_url = database_url
        self.routes = routes
        self.setup = setup
        self.client = client
        self.kinds = kinds

    @contextmanager
    def driver(self) -> Iterator[RouteDriver]:
        """A driver on a schema and Redis prefix of its own, both removed afterwards."""
        with scratch(self.database_url, self.client) as (conn, prefix):
            self.setup(conn)
            driver = RouteDriver(
                self.routes, conn, self.client, key_prefix=prefix, kinds=self.kinds
            )
            try:
                yield driver
            finally:
                driver.close()

    def rows(
        self, events: Sequence[Event], batches: Arrival, read: Mapping[str, str]
    ) -> dict[str, list[tuple[Any, ...]]]:
        """Send the batches of ``events`` and read every named table's rows, sorted."""
        with self.driver() as driver:
            for batch in batches:
                driver.send([events[i] for i in batch])
            return {t: sorted(driver.conn.execute(q).fetchall()) for t, q in read.items()}


def _queries(table_columns: Mapping[str, Sequence[str] | None]) -> dict[str, str]:
    queries = {}
    for table, columns in table_columns.items():
        names = sql.SQL("*") if not columns else sql.SQL(", ").join(map(sql.Identifier, columns))
        target = sql.Identifier(*table.split("."))
        queries[table] = sql.SQL("SELECT {} FROM {}").format(names, target).as_string(None)
    return queries


def _report(events: Sequence[Event], batches: Arrival, table: str, want: Any, got: Any) -> str:
    arrival = " | ".join(
        ", ".join(f"{events[i].entity_id}#{events[i].seq}" for i in batch) for batch in batches
    )
    missing = [r for r in want if r not in got]
    extra = [r for r in got if r not in want]
    return (
        f"{table} differs from the in-order result after this arrival "
        f"(poll batches split by |): {arrival}\n  expected rows not there: {missing}\n"
        f"  rows instead: {extra}"
    )


def check_order_independence(  # noqa: PLR0913 - the options are keyword-only
    routes: Sequence[Route] | str | Path,
    events: Sequence[Event],
    *,
    database_url: str,
    tables: Mapping[str, Sequence[str] | None],
    setup: Setup = lambda _conn: None,
    redis_client: RedisClient | None = None,
    max_examples: int = 50,
    random_seed: int = 0,
    duplicates: bool = True,
    kinds: Mapping[str, Kind] = KINDS,
) -> None:
    """Apply ``events`` in order, then in many arrival orders; every order must leave the same rows.

    ``tables`` names the tables to compare and, for each, the columns (None: all of them;
    leave out columns such as arrival timestamps). ``setup`` creates the user's tables in
    each fresh schema. Raises ``OrderDependenceError`` naming the smallest failing arrival
    found and the rows that differ.
    """
    run = _Run(database_url, routes, setup, redis_client, kinds)
    read = _queries(tables)
    expected = run.rows(events, [[i] for i in range(len(events))], read)

    @seed(random_seed)
    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(arrivals(len(events), duplicates=duplicates))
    def each_arrival(batches: Arrival) -> None:
        got = run.rows(events, batches, read)
        for table, want in expected.items():
            if got[table] != want:
                raise OrderDependenceError(_report(events, batches, table, want, got[table]))

    each_arrival()
