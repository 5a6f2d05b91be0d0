"""The route-kind interface: what every kind of route gives the consumer loop, and takes.

A kind is a registry entry (``Kind``): how to parse its ``[[route]]`` settings, and
how to start an ``Applier`` for one route. The loop hands each applier its share of a
poll batch and gets one ``Outcome`` back, whatever the kind: the loop counts it,
dead-letters what was refused, sends what was held to the held topic, and commits
the offsets only after all of that.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg

from consumer.kinds._outcome import Carried, Outcome
from consumer.kinds._plugin import Commands, Duties, Inspector
from consumer.kinds._resources import Resources
from consumer.kinds._route import Route
from consumer.kinds._spec import Spec
from schemas import Event
from schemas.runtime.config import InorderSettings
from schemas.runtime.migrate import MigrationSet

if TYPE_CHECKING:
    from consumer.settings import RouteSettings, SweeperSettings

Conn = psycopg.Connection[Any]
# The route type of a kind's applier.
R = TypeVar("R", bound="Route")


class Applier(abc.ABC, Generic[R]):
    """One route at work in the consumer: a kind's applier subclasses this.

    ``connect`` and ``apply`` are the kind's own. ``collect`` (work carried past its poll
    batch, when connected with ``Resources.carry``), ``ready`` and ``close`` (connections
    of the applier's own, a step route's lanes) do nothing unless a kind needs them.
    """

    route: R

    def connect(self, resources: Resources[RouteSettings]) -> None:
        """Check the route against the database (and bind what else the kind uses)."""

    @abc.abstractmethod
    def apply(self, conn: Conn, events: Sequence[Event], raw: Mapping[Event, bytes]) -> Outcome:
        """Apply the route's events of one poll batch and commit them (``raw``: their bytes)."""

    def collect(self, wait: float | None = 0.0) -> Carried:
        """Work carried past its poll batch that finished since the last look (none here).

        ``wait``: how long to wait for some to finish (None: until all has).
        """
        return Carried()

    def ready(self) -> None:
        """Open what the route keeps open from start-up, once the connections every route
        may hold are known to fit the server (nothing here)."""

    def close(self) -> None:
        """Let go of what the applier holds beyond the program's connection (nothing here)."""

    def connections(self) -> int:
        """PostgreSQL connections of its own the applier may hold at once, once connected
        (a step route's lanes; none here)."""
        return 0

    def share(self) -> None:
        """Other consumers apply the same entities' events at the same moment (a share
        group): serialize what must not run twice at once (nothing here)."""


@dataclass(frozen=True, slots=True)
class Kind:
    """A registry entry: parse a route of this kind, start its applier (imports, no I/O)."""

    name: str
    parse: Callable[[Spec], Route]
    start: Callable[[Any], Applier[Any]]
    # The consumer's start-up check of what the kind's routes need besides PostgreSQL and
    # Kafka (Redis that keeps parks, a relay on the outbox): raises ``StartupError`` with
    # what to fix, or logs a warning; run once, before any route is connected.
    check: Callable[[Resources[RouteSettings]], None] | None = None
    # Tables its routes write besides the consumer's own (migrated at start-up).
    migrations: tuple[MigrationSet, ...] = ()
    # The dataclasses whose ``setting`` fields a [[route]] of this kind may set: the
    # route's, then any nested table's (rendered into the routes-file reference).
    settings: tuple[type, ...] = ()
    # What the active sweeper runs for the kind's routes (None: nothing periodic).
    duties: Callable[[Sequence[Any], Resources[SweeperSettings]], Duties] | None = None
    # Its part of inorder-admin's explain, audit and republish (None: outbox only, and
    # the audit lists its routes as not audited).
    inspector: Inspector | None = None
    # Its own inorder-admin commands.
    commands: Commands | None = None
    # Gauges the consumer keeps current from the kind's tables, every few seconds.
    gauges: Callable[[Conn], None] | None = None
    # What ``inorder-consumer migrate`` does for the kind's routes besides the tables
    # (moving data an earlier release kept elsewhere); returns what it did, one line each.
    upgrade: Callable[[Sequence[Any], Resources[RouteSettings]], list[str]] | None = None
    # The kind's own process settings (``INORDER_`` variables): composed into the programs'
    # settings, or read from the environment once (``Resources.part``); listed per kind
    # in the settings reference.
    process: type[InorderSettings] | None = None
    # The module of the kind's own Prometheus metrics (listed in the metrics reference).
    metrics: ModuleType | None = None
    # Problems among the kind's routes taken together (two routes that would write one
    # table's columns, say), each naming the routes and what to fix.
    together: Callable[[Sequence[Any]], list[str]] | None = None
