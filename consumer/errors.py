"""Errors of the consumer."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.errors import InorderError


class ConsumerError(InorderError):
    """Raised for any failure the consumer names."""


class RoutesError(ConsumerError):
    """Raised when the routes file, or the tables it names, cannot be used; lists every problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class StoreNotDurableError(ConsumerError):
    """Raised at start-up when step routes would park events in a Redis that can lose them."""


class DependencyDownError(ConsumerError):
    """Raised when PostgreSQL, Redis or Kafka cannot take the batch; the batch is retried."""
