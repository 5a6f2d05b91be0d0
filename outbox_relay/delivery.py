"""One delivery: a read's rows and messages, and where it leaves each slice's cursor.

The publisher makes and sends deliveries; tracing reads them for the send's span.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outbox_relay.frontier import Cursor
from outbox_relay.rows import ID, SLICE, Message, Row


@dataclass(slots=True)
class Delivery:
    """One read, ready to send: its rows and messages, and where it leaves each cursor."""

    cursors: dict[int, Cursor]
    rows: list[Row] = field(default_factory=list)  # as ``store.read`` returns them
    messages: list[Message] = field(default_factory=list)
    oldest: float | None = None
    full: bool = False  # some slice had more rows than one read took

    def slice_of(self) -> dict[int, int]:
        """Row id to slice (looked up only when a delivery failed)."""
        return {row[ID]: row[SLICE] for row in self.rows}
