"""What a kind adds besides its applier: sweeper duties, an inspector and its own admin commands.

The sweeper keeps the lease and the tick loop and runs each kind's ``Duties``;
``inorder-admin`` keeps the generic commands (``republish``, ``audit``, ``explain``) and
asks each kind's ``Inspector`` for its part of them, and dispatches the kind's own
``Commands``. Both programs hand a kind the same ``Tools``: connections opened on first
use, under the program's settings.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from confluent_kafka import Producer

from schemas.republish import RepublishResult

if TYPE_CHECKING:
    from consumer.admin.audit import Audit
    from consumer.kinds._base import Route
    from consumer.settings import SweeperSettings
    from schemas.runtime.redis_client import RedisClient

Conn = psycopg.Connection[Any]
Rows = list[dict[str, Any]]


class Tools(Protocol):
    """Connections a kind's duties and commands use, each opened by the program."""

    @property
    def settings(self) -> SweeperSettings:
        """The program's settings (the sweeper's and inorder-admin's are the same)."""

    @property
    def conn(self) -> Conn:
        """The consumer's database, autocommit (open a transaction where one is needed)."""

    @property
    def redis(self) -> RedisClient:
        """Redis under the consumers' key prefix (an ``AdminError`` when not configured)."""

    @property
    def producer(self) -> Producer:
        """An idempotent producer; the caller flushes."""


class AdminTools(Tools, Protocol):
    """``Tools`` plus what an operator's command shows and finds."""

    def show(self, title: str, rows: Sequence[dict[str, Any]]) -> None:
        """Rows as a table, TSV or JSON lines."""

    def rows(self, title: str, query: str) -> None:
        """Show what a read-only statement answers."""

    def routed(self, ref: str) -> tuple[Route, str]:
        """Split ``stream:entity_id`` of a routed stream (an ``AdminError`` otherwise)."""


class Answered(StrEnum):
    """What a kind made of one republish result."""

    CHANGED = "changed"  # it answered an open request, and a gap moved
    UNCHANGED = "unchanged"  # it answered an open request; nothing to change
    UNMATCHED = "unmatched"  # it answers no open request of this kind: ignored, counted


class SweepReport(Counter[str]):
    """What one sweep did, counted by name (``escalated``, ``batches_expired``, ...)."""

    @property
    def changed(self) -> bool:
        """Whether anything an operator watches moved (gauges follow at once)."""
        return any(n for name, n in self.items() if name != "overdue")


class Duties(Protocol):
    """A kind's periodic work, run by the active sweeper.

    Duties that open connections of their own may also have a ``close()``, called once as
    the sweeper stops.
    """

    def sweep(self, report: SweepReport) -> None:
        """One pass over the kind's routes, counting what it did into ``report``."""

    def answer(self, result: RepublishResult) -> Answered:
        """Act on the relay's result for one of the kind's streams, if it answers a request
        the kind made and still waits on (any other writer of the results topic could have
        written it); say what came of it.

        While tracing, the context the relay answered in is current (``schemas.tracing``).
        """

    def gauges(self, *, every: bool) -> None:
        """Export the kind's gauges: all of them, or (``every`` False) those a change moves."""


class Inspector(Protocol):
    """A kind's part of ``explain``, ``audit`` and ``republish``."""

    def generation(self, conn: Conn, route: Any, entity_id: str) -> int | None:
        """The generation the consumer holds for an entity (None: nothing applied yet)."""

    def story(self, tools: Tools, route: Any, entity_id: str) -> Findings:
        """What the kind's tables (and Redis) hold about one entity, read-only."""

    def audit(self, audit: Audit, route: Any) -> None:
        """Compare the route's tables with the outbox, adding divergences to ``audit``."""


@dataclass(slots=True)
class Findings:
    """What a kind holds about one entity: its applied state, named row lists, what is parked."""

    applied: dict[str, Any] | None = None
    # Section key -> (title shown, rows); the key names it in --json.
    sections: dict[str, tuple[str, Rows]] = field(default_factory=dict)
    # Seqs held back in the kind's own store until they are due (parked).
    parked: list[int] = field(default_factory=list)

    @property
    def known(self) -> bool:
        """Whether the kind has ever seen the entity."""
        return bool(self.applied or self.parked or any(r for _, r in self.sections.values()))


@dataclass(frozen=True, slots=True)
class Commands:
    """A kind's own ``inorder-admin`` commands: their names, their parsers, and how to run them."""

    names: tuple[str, ...]
    # Adds the commands' parsers to inorder-admin's subparsers.
    add: Callable[[argparse._SubParsersAction[Any]], None]
    # Runs the parsed command over the routes of this kind.
    run: Callable[[argparse.Namespace, AdminTools, Sequence[Any]], None]
