"""The route-kind interface: what every kind of route gives the consumer loop, and takes.

A kind is a registry entry (``Kind``): how to parse its ``[[route]]`` settings, and
how to start an ``Applier`` for one route. The loop hands each applier its share of a
poll batch and gets one ``Outcome`` back, whatever the kind: the loop counts it,
dead-letters what was refused, sends what was held to the held topic, and commits
the offsets only after all of that.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from consumer import metrics
from consumer.kinds._plugin import Commands, Duties, Inspector, Tools
from consumer.kinds._spec import Spec
from schemas import Event
from schemas.runtime.migrate import MigrationSet

if TYPE_CHECKING:
    from consumer.settings import ConsumerSettings
    from schemas.runtime.redis_client import RedisClient

Conn = psycopg.Connection[Any]


class Route(Protocol):
    """What the consumer needs of any route: its kind and the entity streams it takes."""

    @property
    def stream(self) -> str:
        """The route's own entity stream (its name in logs, metrics and tables)."""

    @property
    def kind(self) -> str:
        """The registry name of the route's kind."""

    @property
    def streams(self) -> tuple[str, ...]:
        """Every entity stream whose events go to this route."""

    @property
    def topics(self) -> tuple[str, ...]:
        """Kafka topics the route writes to (created at start-up with the others)."""


class OneStream:
    """For route dataclasses that take their own stream only and write only to PostgreSQL."""

    __slots__ = ()
    stream: str

    @property
    def streams(self) -> tuple[str, ...]:
        """The one entity stream this route takes."""
        return (self.stream,)

    @property
    def topics(self) -> tuple[str, ...]:
        """None: the route writes only to PostgreSQL."""
        return ()


@dataclass(frozen=True, slots=True)
class Refusal:
    """An event a route could not use: a stable reason code and what exactly was wrong."""

    event: Event
    reason: str
    detail: str
    # The event's bytes when no message of the poll batch carries it (an event drained
    # from parking): the dead-letter copy is made of them.
    copy: bytes | None = None


@dataclass(slots=True)
class Outcome:
    """What a route did with its share of a poll batch, once its work is committed.

    A kind only reports; ``count``, called once the whole poll batch is done, is the one
    place its figures become metrics. ``refused`` go to the dead-letter topic and
    ``held`` to the held topic, each with its reason.
    """

    applied: list[Event] = field(default_factory=list)
    stale: list[Event] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    held: list[Refusal] = field(default_factory=list)
    # Early events parked, each with how far ahead of its entity's next seq it came.
    parked: list[tuple[Event, int]] = field(default_factory=list)
    # The event type of each entity newly given up on (held: its parking set is full).
    escalated: list[str] = field(default_factory=list)
    # Entities stopped until a person looks.
    stopped: int = 0
    # Step routes: failed calls to be made again, by event type; steps given up on after
    # their last call, by (event type, what then).
    retried: Counter[str] = field(default_factory=Counter)
    exhausted: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Batch routes: worker results by verdict, batches assembled by outcome, and
    # batches found inconsistent.
    batch_results: Counter[str] = field(default_factory=Counter)
    batches_assembled: Counter[str] = field(default_factory=Counter)
    batches_inconsistent: int = 0
    # Events whose work goes on after the poll batch (a step lane's entity): the loop
    # commits no offset past them until a later outcome lists them ``released``.
    deferred: list[Event] = field(default_factory=list)
    released: list[Event] = field(default_factory=list)

    def count(self, stream: str) -> None:
        """Add everything the route reported to the metrics."""
        metrics.APPLIED.labels(stream).inc(len(self.applied))
        for event_type, n in Counter(e.event_type for e in self.stale).items():
            metrics.STALE.labels(event_type).inc(n)
        for event, distance in self.parked:
            metrics.PARKED.labels(event.event_type).inc()
            metrics.REORDER_DISTANCE.observe(distance)
        for event_type in self.escalated:
            metrics.GAPS_ESCALATED.labels(event_type).inc()
        if self.stopped:
            metrics.entity_stopped(stream, self.stopped)
        for event_type, n in self.retried.items():
            metrics.RETRIES.labels(stream, event_type).inc(n)
        for (event_type, then), n in self.exhausted.items():
            metrics.RETRIES_EXHAUSTED.labels(stream, event_type, then).inc(n)
        if self.retried or self.exhausted:
            metrics.reviews_changed()
        for verdict, n in self.batch_results.items():
            metrics.BATCH_RESULTS.labels(verdict).inc(n)
        for assembled, n in self.batches_assembled.items():
            metrics.BATCHES_ASSEMBLED.labels(assembled).inc(n)
        if self.batches_inconsistent:
            metrics.BATCHES_INCONSISTENT.inc(self.batches_inconsistent)


@dataclass(frozen=True, slots=True)
class Links:
    """What a route is started with: PostgreSQL, the program's settings, Redis when needed.

    ``redis`` is there when a kind of the routes file declares ``Need.REDIS``; what a
    kind keeps there and under which names it reads from ``settings``. ``carry`` is
    true in the consumer's loop, which calls ``collect``: an applier may then leave
    work running past its poll batch (``Outcome.deferred``).
    """

    conn: Conn
    settings: ConsumerSettings
    redis: RedisClient | None = None
    carry: bool = False

    @classmethod
    def of(cls, tools: Tools) -> Links:
        """The links a route is started with where the sweeper or inorder-admin runs it."""
        return cls(tools.conn, tools.settings, tools.redis)


class Applier(Protocol):
    """One route at work in the consumer.

    An applier that holds connections of its own (a step route's lanes) may also have a
    ``close()``, called once as the consumer stops. One that defers work past its poll
    batch (connected with ``Links.carry``) has a ``collect(wait)`` returning ``Carried``.
    """

    @property
    def route(self) -> Route:
        """The route this applier was started for."""

    def connect(self, links: Links) -> None:
        """Check the route against the database (and bind Redis when the kind parks)."""

    def apply(self, conn: Conn, events: Sequence[Event], raw: Mapping[Event, bytes]) -> Outcome:
        """Apply the route's events of one poll batch and commit them (``raw``: their bytes)."""


@dataclass(slots=True)
class Carried:
    """Deferred work that finished since the last look, and the outage that stopped some.

    Each outcome's ``released`` events are done (applied, parked or refused). Work an
    outage stopped stays deferred and is tried again at the next ``collect``: the loop
    waits the outage out first.
    """

    outcomes: list[Outcome] = field(default_factory=list)
    outage: BaseException | None = None


class Need(enum.StrEnum):
    """What a kind's routes need besides the consumer's own PostgreSQL and Kafka."""

    # They park events in Redis: REDIS_URL is required and checked for durability.
    REDIS = "redis"
    # They write events to the consumer's own outbox: a relay must publish it.
    RELAY = "relay"


@dataclass(frozen=True, slots=True)
class Kind:
    """A registry entry: parse a route of this kind, start its applier (imports, no I/O)."""

    name: str
    parse: Callable[[Spec], Route]
    start: Callable[[Any], Applier]
    # What its routes need besides PostgreSQL and Kafka.
    needs: frozenset[Need] = frozenset()
    # Tables its routes write besides the consumer's own (migrated at start-up).
    migrations: tuple[MigrationSet, ...] = ()
    # The dataclasses whose ``setting`` fields a [[route]] of this kind may set: the
    # route's, then any nested table's (rendered into the routes-file reference).
    settings: tuple[type, ...] = ()
    # What the active sweeper runs for the kind's routes (None: nothing periodic).
    duties: Callable[[Sequence[Any], Tools], Duties] | None = None
    # Its part of inorder-admin's explain, audit and republish (None: outbox only, and
    # the audit lists its routes as not audited).
    inspector: Inspector | None = None
    # Its own inorder-admin commands.
    commands: Commands | None = None
    # Gauges the consumer keeps current from the kind's tables, every few seconds.
    gauges: Callable[[Conn], None] | None = None
    # Problems among the kind's routes taken together (two routes that would write one
    # table's columns, say), each naming the routes and what to fix.
    together: Callable[[Sequence[Any]], list[str]] | None = None
