"""The step kind's errors (under the consumer's root) and its dead-letter reasons."""

from __future__ import annotations

from consumer.errors import ConsumerError, StartupError
from schemas import Event
from schemas.errors import OutageError

# A step given up on after its last call, its route saying dead_letter.
STEP_FAILED = "step_failed"
# An early event whose entity's parking set is full: held, its entity escalated.
PARK_CAP_REACHED = "park_cap_reached"


class StoreNotDurableError(StartupError):
    """Raised at start-up when step routes would park events in a Redis that can lose them."""


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


class StatementsLostError(ConsumerError, OutageError):
    """Raised when a lane's prepared statements were deallocated inside a step's transaction
    again after the closing went back to its savepoint and prepared them once more.

    The transaction is lost with them (its work, its claim); the loop waits it out and
    the entity's lane applies the step again from its start.
    """
