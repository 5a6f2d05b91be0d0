"""Errors of the consumer."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.errors import InorderError, OperatorError, OutageError


class ConsumerError(InorderError):
    """Raised for any failure the consumer names."""


class RoutesError(ConsumerError):
    """Raised when the routes file, or the tables it names, cannot be used; lists every problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class StartupError(ConsumerError):
    """Raised at start-up when a kind's check of its dependencies fails; the message says what
    to fix (one line, no traceback)."""


class TableChangedError(ConsumerError, OperatorError):
    """Raised when a table a route writes no longer is what the route was checked against."""


class DependencyDownError(ConsumerError, OutageError):
    """Raised when PostgreSQL, Redis or Kafka cannot take the batch; the batch is retried."""


class SchemaNotReadyError(ConsumerError, OutageError):
    """Raised when the consumer's tables need migrations its role may not apply.

    An outage of PostgreSQL's: the program waits, unready (``postgres: schema_not_ready``),
    until the owner runs ``inorder-consumer migrate``.
    """

    dependency = "postgres"


class NotConfiguredError(ConsumerError):
    """Raised when a kind asks its program for a dependency the settings do not name."""


class AdminError(ConsumerError):
    """Raised when an operator command cannot be done as asked; the message says why."""
