"""What the consumer needs of any route: its kind, its streams, the topics it writes."""

from __future__ import annotations

from typing import Protocol


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
