"""Errors of the contract. ``InorderError`` is the root every inorder package builds on."""

from __future__ import annotations


class InorderError(Exception):
    """Raised for any failure inorder names; the root of every package's errors."""


class OutageError(InorderError):
    """Raised when a dependency cannot take the work now; the same input is tried again later."""


class OperatorError(InorderError):
    """Raised when only the operator can fix what a process met (a table changed under it)."""


class ContractError(InorderError):
    """Raised when something does not meet the event contract."""


class DecodeError(ContractError):
    """Raised when bytes from Kafka are not a valid event envelope.

    ``reason`` is a short stable code (it labels metrics and dead-letter headers),
    ``detail`` says what exactly is wrong, and ``raw`` keeps the bytes so that the
    message can be dead-lettered whole.
    """

    def __init__(
        self, reason: str, detail: str, raw: bytes | None, field: str | None = None
    ) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.raw = raw
        self.field = field


class PayloadError(ContractError):
    """Raised when a payload does not match the schema of its event type."""

    def __init__(self, event_type: str, detail: str) -> None:
        super().__init__(f"payload of {event_type}: {detail}")
        self.event_type = event_type
        self.detail = detail


class UnknownEventTypeError(PayloadError):
    """Raised when no payload schema is registered for an event type."""

    def __init__(self, event_type: str) -> None:
        super().__init__(
            event_type,
            f"no payload schema for this event type: add {event_type}.schema.json to the "
            "folder INORDER_PAYLOAD_SCHEMAS names, or set INORDER_UNKNOWN_EVENT_TYPES=allow "
            "to send types without a schema unchecked",
        )


class SchemaDefinitionError(ContractError):
    """Raised when a schema file uses something the codec cannot enforce."""


class OutboxError(InorderError):
    """Raised when an event cannot be written to the outbox."""


class NotInTransactionError(OutboxError):
    """Raised when ``emit`` is called on a connection with no open transaction."""


class InvalidEventError(OutboxError):
    """Raised when an event to emit breaks the envelope or its payload schema."""


class DuplicateEventError(OutboxError):
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


class MigrationError(InorderError):
    """Raised when a migration file cannot be applied."""


class TopicSettingsError(InorderError):
    """Raised when the topic settings cannot work on the cluster (more replicas than brokers)."""
