"""``RouteDriver``: the consumer's route kinds on a real database, one poll batch per ``send``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from consumer import tables
from consumer.kinds import KINDS, Applier, Arrivals, Kind, Outcome, Resources, Route
from consumer.loop.poll import Routing
from consumer.routes import parse_routes, read_routes
from consumer.settings import RouteSettings
from schemas import Event, default_event_id, encode
from schemas.runtime.redis_client import RedisClient

# Timestamps are informational only; tests need not invent them.
WHEN = "2026-01-01T00:00:00Z"


def event(
    entity_id: str,
    seq: int,
    event_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    generation: int = 1,
    stream: str | None = None,
) -> Event:
    """An event of ``stream`` (by default the part of ``event_type`` before the first dot)."""
    entity_type = stream or event_type.partition(".")[0]
    return Event(
        default_event_id(entity_type, entity_id, generation, seq),
        event_type,
        entity_type,
        entity_id,
        generation,
        seq,
        WHEN,
        WHEN,
        dict(payload or {}),
    )


@dataclass(slots=True)
class Sent:
    """What one ``send`` did: each route's outcome, and events no route takes."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    unrouted: list[Event] = field(default_factory=list)


class RouteDriver:
    """Runs routes as the consumer does, on ``conn`` (and Redis for step routes), without Kafka.

    The consumer's own tables are migrated into the connection's schema first. Each
    ``send`` is one poll batch: every route applies its share in the consumer's order
    with the consumer's code, parking in the real Redis under ``key_prefix``.
    """

    def __init__(
        self,
        routes: str | Path | Sequence[Route],
        conn: psycopg.Connection[Any],
        client: RedisClient | None = None,
        *,
        key_prefix: str = "inorder-test",
        kinds: Mapping[str, Kind] = KINDS,
    ) -> None:
        if isinstance(routes, Path):
            routes = read_routes(routes, kinds)
        elif isinstance(routes, str):
            routes = parse_routes(routes, "routes", kinds)
        self.conn = conn
        self.routing = Routing.start(routes, kinds)
        given: dict[str, Any] = {"redis_key_prefix": key_prefix, "database_url": None}
        given["redis_url"] = None
        self.resources = Resources(
            RouteSettings.model_construct(**given), "inorder-test", conn=conn, redis=client
        )
        self.routing.connect(self.resources)
        tables.migrate(conn, tables.migration_sets(self.routing.kinds))

    def close(self) -> None:
        """Close what the routes opened beside ``conn`` (the lanes of step routes)."""
        self.routing.close()

    def send(self, events: Sequence[Event]) -> Sent:
        """Apply ``events`` as one poll batch; duplicates and any order are allowed."""
        shares, unrouted = self.routing.split(events)
        sent = Sent(unrouted=unrouted)
        raw = Arrivals((e, encode(e)) for e in events)
        for applier, share in shares:
            sent.outcomes[applier.route.stream] = self._apply(applier, share, raw)
        return sent

    def _apply(
        self, applier: Applier[Any], events: list[Event], raw: Mapping[Event, bytes]
    ) -> Outcome:
        outcome = applier.apply(self.conn, events, raw)
        outcome.count(applier.route.stream)
        return outcome
