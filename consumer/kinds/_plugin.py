"""What a kind adds besides its applier: sweeper duties, an inspector and its own admin commands.

The sweeper keeps the lease and the tick loop and runs each kind's ``Duties``;
``inorder-admin`` keeps the generic commands (``republish``, ``audit``, ``explain``) and
asks each kind's ``Inspector`` for its part of them, and dispatches the kind's own
``Commands``. Both programs hand a kind their ``Resources``: connections opened on
first use, under the program's settings.
"""

from __future__ import annotations

import abc
import argparse
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import groupby
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from consumer.kinds._resources import Resources
from schemas.republish import RepublishResult

if TYPE_CHECKING:
    from consumer.kinds._audit import Audit
    from consumer.kinds._route import Route
    from consumer.settings import SweeperSettings

Conn = psycopg.Connection[Any]
Rows = list[dict[str, Any]]


class AdminTools(Resources["SweeperSettings"], abc.ABC):
    """``inorder-admin``'s resources, plus what an operator's command shows and finds."""

    @abc.abstractmethod
    def show(self, title: str, rows: Sequence[dict[str, Any]]) -> None:
        """Rows as a table, TSV or JSON lines."""

    @abc.abstractmethod
    def rows(self, title: str, query: str) -> None:
        """Show what a read-only statement answers."""

    @abc.abstractmethod
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


class Duties(abc.ABC):
    """A kind's periodic work, run by the active sweeper; the kind's duties subclass this.

    ``sweep`` is the kind's own; ``answer``, ``gauges`` and ``close`` (connections the
    duties opened themselves) do nothing unless the kind needs them.
    """

    @abc.abstractmethod
    def sweep(self, report: SweepReport) -> None:
        """One pass over the kind's routes, counting what it did into ``report``."""

    def answer(self, result: RepublishResult) -> Answered:
        """Act on the relay's result for one of the kind's streams, if it answers a request
        the kind made and still waits on (any other writer of the results topic could have
        written it); say what came of it.

        While tracing, the context the relay answered in is current (``schemas.tracing``).
        Here: no request of this kind's is open.
        """
        return Answered.UNMATCHED

    def gauges(self, *, every: bool) -> None:  # noqa: B027 - a hook
        """Export the kind's gauges: all of them, or (``every`` False) those a change moves."""

    def close(self) -> None:  # noqa: B027 - a hook
        """Close what the duties opened themselves (nothing here)."""


class Inspector(Protocol):
    """A kind's part of ``explain``, ``audit`` and ``republish``."""

    def generation(self, conn: Conn, route: Any, entity_id: str) -> int | None:
        """The generation the consumer holds for an entity (None: nothing applied yet)."""

    def story(self, tools: Resources[SweeperSettings], route: Any, entity_id: str) -> Findings:
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


def ranges(seqs: Iterable[int]) -> str:
    """``1..5, 7, 9..10`` for sorted seqs."""
    parts = []
    for _, run in groupby(enumerate(seqs), key=lambda pair: pair[1] - pair[0]):
        found = [seq for _, seq in run]
        parts.append(str(found[0]) if len(found) == 1 else f"{found[0]}..{found[-1]}")
    return ", ".join(parts)
