"""Helpers for step tests: a route, its stores, and reading what was applied."""

from __future__ import annotations

from typing import Any

import redis
from pydantic import SecretStr

from consumer import tables
from consumer.kinds import Arrivals, Resources
from consumer.kinds.steps import StepApplier
from consumer.loop.poll import Routing
from consumer.routes import parse_routes
from consumer.settings import ConsumerSettings
from schemas import Event, encode
from tests.conftest import PgSchema
from tests.integration import step_handlers

STREAM = "ledger"


def routes_text(handler: str = "record", *, max_parked: int = 1000, extra: str = "") -> str:
    """A routes file with one step route for the ``ledger`` stream (``*_many``: many = true)."""
    function = f"tests.integration.step_handlers:{handler}"
    spec = f'{{ function = "{function}", many = true }}' if "_many" in handler else f'"{function}"'
    return (
        f'[[route]]\nstream = "{STREAM}"\nkind = "step"\nmax_parked = {max_parked}\n'
        f'[route.handlers]\n"ledger.added" = {spec}\n{extra}'
    )


def step(
    seq: int, entity: str = "a", generation: int = 1, event_type: str = "ledger.added"
) -> Event:
    """A ledger event."""
    return Event(
        f"{entity}:{generation}:{seq}",
        event_type,
        STREAM,
        entity,
        generation,
        seq,
        "2026-11-30T10:00:00Z",
        "2026-11-30T10:00:01Z",
        {"amount": seq},
    )


def prepare(schema: PgSchema) -> None:
    """Create the step tables and the log table the handlers write."""
    with schema.connect(autocommit=True) as conn:
        tables.migrate(conn)
        conn.execute(step_handlers.TABLE)


def _lent(
    client: redis.Redis, prefix: str, database_url: str | None, carry: bool, settings: Any
) -> Resources[Any]:
    """What a route is connected with in these tests: the consumer's settings, ``client``."""
    given: dict[str, Any] = {
        "redis_key_prefix": prefix.rstrip(":"),
        "database_url": None,
        "redis_url": None,
        **settings,
    }
    if database_url is not None:
        given["database_url"] = SecretStr(database_url)
    return Resources(
        ConsumerSettings.model_construct(**given), "inorder-test", carry=carry, redis=client
    )


def runner(
    client: redis.Redis,
    prefix: str,
    text: str,
    *,
    database_url: str | None = None,
    carry: bool = False,
    **settings: Any,
) -> StepApplier:
    """The step route in ``text`` started as the consumer starts it, parking under ``prefix``.

    With ``database_url`` its lanes get connections of their own; ``carry`` lets them go
    on past a batch, as in the consumer's loop (``settle`` waits for them); ``settings``
    are more of the consumer's settings (``step_lanes``).
    """
    [route] = parse_routes(text)
    applier = StepApplier(route)  # type: ignore[arg-type]
    lent = _lent(client, prefix, database_url, carry, settings)
    try:
        applier.connect(lent)
    finally:
        lent.close()  # the connection connecting may have opened; the lanes keep their own
    applier.ready()
    return applier


def routing(client: redis.Redis, prefix: str, text: str, database_url: str) -> Routing:
    """Every route in ``text`` started and connected as the consumer connects them."""
    started = Routing.start(parse_routes(text))
    lent = _lent(client, prefix, database_url, False, {})
    try:
        started.connect(lent)
    finally:
        lent.close()
    return started


def settle(run: StepApplier) -> list[Event]:
    """Wait for every lane that went on past its batch; the events they held."""
    held: list[Event] = []
    while True:
        carried = run.collect(None)
        assert carried.outage is None, carried.outage
        for outcome in carried.outcomes:
            outcome.count(run.route.stream)
            held += [h.event for h in outcome.held]
        if not carried.outcomes:
            return held


def feed(run: StepApplier, conn: Any, events: list[Event]) -> list[Event]:
    """Give one batch to the route, counted as the loop counts it; the events it held."""
    outcome = run.apply(conn, events, Arrivals((e, encode(e)) for e in events))
    outcome.count(run.route.stream)
    return [held.event for held in outcome.held]


def applied(schema: PgSchema, entity: str = "a") -> list[tuple[int, int]]:
    """(generation, seq) of every applied step of an entity, in the order applied."""
    with schema.connect() as conn:
        rows = conn.execute(
            "SELECT generation, seq FROM applied_steps WHERE entity_id = %s ORDER BY n",
            (entity,),
        ).fetchall()
    return [(int(g), int(s)) for g, s in rows]


def progress(schema: PgSchema, entity: str = "a") -> tuple[Any, ...] | None:
    """(generation, last_applied, held, stopped_at_seq, stop_reason) of an entity."""
    with schema.connect() as conn:
        return conn.execute(
            "SELECT generation, last_applied, held_at IS NOT NULL, stopped_at_seq, stop_reason "
            "FROM inorder_step_progress WHERE route = %s AND entity_id = %s",
            (STREAM, entity),
        ).fetchone()
