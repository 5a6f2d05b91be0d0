"""Errors of the relay."""

from __future__ import annotations

from schemas.errors import InorderError, OutageError


class RelayError(InorderError):
    """Raised for any failure the relay names."""


class SchemaNotReadyError(RelayError, OutageError):
    """Raised when the outbox table is missing or older than this relay needs."""


class UnsafeClusterError(RelayError):
    """Raised when the database is a standby or the outbox's transaction ids are not its own."""


class RowProblem(RelayError):  # noqa: N818 - a verdict about a row, not a crash
    """Raised when an outbox row cannot become a Kafka message; the row is marked failed."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
