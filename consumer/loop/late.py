"""Work that finishes after its poll batch (a step lane's entity), owned in one place.

An outcome's ``deferred`` events are held at the source with the message each came
in; applier by applier, ``gather`` collects the work that finished since, reports it
as a batch's outcomes are reported (letters, counts), and releases the messages of
the events it lists ``released``. An outage that stopped some work is returned: the
loop waits it out and gathers again, and the work is tried again meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import Message

from consumer.kinds import Applier, Arrivals, Outcome, Resources
from consumer.kinds._report import report
from consumer.loop.source import Source
from schemas import Event

if TYPE_CHECKING:
    from consumer.settings import RouteSettings


class LateWork:
    """The events routes carry past their batch, their messages, and what finished."""

    def __init__(self, source: Source, appliers: Sequence[Applier[Any]]) -> None:
        self.source = source
        self.appliers = list(appliers)
        # The message of each event routes carried past its batch.
        self._waiting: Arrivals[Message] = Arrivals()
        # Carried work finished and not yet reported (kept through an outage).
        self._finished: list[tuple[Applier[Any], Outcome]] = []

    def __len__(self) -> int:
        """Events carried and not yet released."""
        return len(self._waiting)

    def defer(
        self, outcomes: Sequence[tuple[Applier[Any], Outcome]], by_event: Mapping[Event, Message]
    ) -> None:
        """Hold the message of every event an outcome lists ``deferred``."""
        for _, outcome in outcomes:
            for event in outcome.deferred:
                message = by_event[event]
                self.source.hold(message)
                self._waiting.add(event, message)

    def gather(
        self, resources: Resources[RouteSettings], wait: float | None
    ) -> BaseException | None:
        """Collect what finished (waiting up to ``wait``; None: for all), report it, release.

        Returns the outage that stopped some of the work (tried again at the next call);
        an outage while reporting is raised, and what finished is reported next time.
        """
        outage = None
        for applier in self.appliers:
            carried = applier.collect(wait)
            self._finished += [(applier, o) for o in carried.outcomes]
            outage = outage or carried.outage
        if not self._finished:
            return outage
        settings = resources.settings
        report(resources.conn, resources.producer, settings, [], self._waiting, self._finished)
        for _, outcome in self._finished:
            for event in outcome.released:
                # An event a lane took in a try of its batch that an outage failed is no
                # key here: the batch's next try gave the lane a copy, held and released.
                message = self._waiting.pop(event)
                if message is not None:
                    self.source.release(message)
        self._finished = []
        return outage
