"""Errors of the consumer."""

from __future__ import annotations

from collections.abc import Sequence

from schemas import Event
from schemas.errors import InorderError, OperatorError, OutageError


class ConsumerError(InorderError):
    """Raised for any failure the consumer names."""


class RoutesError(ConsumerError):
    """Raised when the routes file, or the tables it names, cannot be used; lists every problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class TableChangedError(ConsumerError, OperatorError):
    """Raised when a table a route writes no longer is what the route was checked against."""


class StoreNotDurableError(ConsumerError):
    """Raised at start-up when step routes would park events in a Redis that can lose them."""


class DependencyDownError(ConsumerError, OutageError):
    """Raised when PostgreSQL, Redis or Kafka cannot take the batch; the batch is retried."""


class SchemaNotReadyError(ConsumerError, OutageError):
    """Raised when the consumer's tables need migrations its role may not apply.

    An outage of PostgreSQL's: the program waits, unready (``postgres: schema_not_ready``),
    until the owner runs ``inorder-consumer migrate``.
    """

    dependency = "postgres"


class StepFailedError(ConsumerError):
    """Raised inside a batch when a step function raised; the batch is rolled back."""

    def __init__(self, entity_id: str, event: Event, error: BaseException) -> None:
        super().__init__(f"{entity_id} seq {event.seq}: {error!r}")
        self.entity_id = entity_id
        self.event = event
        self.error = error


class StepsUnsettledError(ConsumerError):
    """Raised when a batch of steps still fails after every failing step was cut."""


class ManyFailedError(ConsumerError):
    """Raised when a ``many`` call of several steps failed: which step it was is not known."""


class PipelinedError(ConsumerError):
    """Raised when a pipelined statement failed and cannot be traced to one entity."""


class AdminError(ConsumerError):
    """Raised when an operator command cannot be done as asked; the message says why."""


class BatchAdminError(AdminError):
    """Raised when a batch command cannot be done as asked; the message says why."""
