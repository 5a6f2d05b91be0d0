"""Errors of the producer side."""

from __future__ import annotations

from schemas.errors import InorderError


class ProducerError(InorderError):
    """Raised for any failure of the producer library."""


class NotInTransactionError(ProducerError):
    """Raised when ``emit`` is called on a connection with no open transaction."""


class InvalidEventError(ProducerError):
    """Raised when an event to emit breaks the envelope or its payload schema."""


class DuplicateEventError(ProducerError):
    """Raised when the outbox already holds this (entity, generation, seq) or event id.

    The caller's transaction is aborted by then and must be rolled back.
    """

    def __init__(self, detail: str, constraint: str | None) -> None:
        super().__init__(
            f"duplicate outbox event ({constraint}): {detail} "
            "Versions must come from the entity's own row in the same transaction."
        )
        self.detail = detail
        self.constraint = constraint


class EntityError(ProducerError):
    """Raised when a version-column operation finds the entity in the wrong state."""


class EntityNotFoundError(EntityError):
    """Raised when the entity to change does not exist or is deleted."""


class EntityExistsError(EntityError):
    """Raised when creating an entity whose id is taken (re-create a deleted one instead)."""


class MigrationError(ProducerError):
    """Raised when a migration file cannot be applied."""
