"""Errors of the producer side.

The outbox writer's errors (``DuplicateEventError`` and its siblings) belong to
``schemas.outbox``, which the consumer writes through too; ``producer`` re-exports them.
"""

from __future__ import annotations

from schemas.errors import InorderError


class ProducerError(InorderError):
    """Raised for any failure of the producer library."""


class EntityError(ProducerError):
    """Raised when a version-column operation finds the entity in the wrong state."""


class EntityNotFoundError(EntityError):
    """Raised when the entity to change does not exist or is deleted."""


class EntityExistsError(EntityError):
    """Raised when creating an entity whose id is taken (re-create a deleted one instead)."""
