"""What a route reports of its share of a poll batch: the generic ``Outcome``, a kind's ``Tally``.

The loop reads only the generic part: what was applied, ignored as stale, refused (to
the dead-letter topic), held (to the held topic), deferred past the batch and released
after it. Whatever else a kind counts (events parked, batches assembled) is its
``Tally``: merged with the rest and turned into the kind's own metrics by the kind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Self

from consumer import labels, metrics
from schemas import Event


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
class Tally:
    """A kind's own figures of one share; this base counts nothing.

    A kind subclasses it as a dataclass whose fields add up (lists, counters, numbers),
    and says in ``count`` which of its metrics each moves.
    """

    def __add__(self, other: Tally) -> Tally:
        """Both tallies as one (fields added); an empty base gives way to the other."""
        if not fields(other):
            return self
        if not fields(self):
            return other
        if type(self) is not type(other):
            raise TypeError(f"{type(self).__name__} and {type(other).__name__} do not add up")
        return self.added(other)

    def added(self, other: Self) -> Self:
        """Field by field sums of two tallies of one kind."""
        return type(self)(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def count(self, stream: str) -> None:
        """Move the kind's metrics by what this tally holds (nothing here)."""

    def attributes(self) -> dict[str, int]:
        """What the tally adds to a traced share's span (nothing here)."""
        return {}


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
    # Events whose work goes on after the poll batch (a step lane's entity): the loop
    # settles none of them until a later outcome lists them ``released``.
    deferred: list[Event] = field(default_factory=list)
    released: list[Event] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)

    def count(self, stream: str) -> None:
        """Add everything the route reported to the metrics."""
        metrics.APPLIED.labels(stream).inc(len(self.applied))
        for event_type, n in Counter(e.event_type for e in self.stale).items():
            metrics.STALE.labels(labels.event_type(event_type)).inc(n)
        self.tally.count(stream)

    def attributes(self) -> dict[str, Any]:
        """What the share did, as a span's attributes."""
        return {
            "inorder.applied": len(self.applied),
            "inorder.stale": len(self.stale),
            "inorder.refused": len(self.refused),
            "inorder.held": len(self.held),
            "inorder.deferred": len(self.deferred),
            **self.tally.attributes(),
        }


def merge(first: Outcome, second: Outcome) -> Outcome:
    """One outcome holding both (lists joined, counts added)."""
    return Outcome(
        **{f.name: getattr(first, f.name) + getattr(second, f.name) for f in fields(Outcome)}
    )


@dataclass(slots=True)
class Carried:
    """Deferred work that finished since the last look, and the outage that stopped some.

    Each outcome's ``released`` events are done (applied, parked or refused). Work an
    outage stopped stays deferred and is tried again at the next ``collect``: the loop
    waits the outage out first.
    """

    outcomes: list[Outcome] = field(default_factory=list)
    outage: BaseException | None = None
