"""A stand-in for a consumed Kafka message, for unit tests of what reads one."""

from __future__ import annotations


class StandIn:
    """What the code under test reads of a message: value, key, headers and its place."""

    def __init__(self, value: bytes | None = b"", offset: int = 0, partition: int = 0) -> None:
        self._value, self._offset, self._partition = value, offset, partition

    def value(self) -> bytes | None:
        """The message's value."""
        return self._value

    def key(self) -> bytes:
        """A fixed key."""
        return b"k"

    def headers(self) -> list[tuple[str, bytes]]:
        """One header, so a copy that drops them shows."""
        return [("trace", b"1")]

    def topic(self) -> str:
        """Always ``events``."""
        return "events"

    def partition(self) -> int:
        """The partition given."""
        return self._partition

    def offset(self) -> int:
        """The offset given."""
        return self._offset
