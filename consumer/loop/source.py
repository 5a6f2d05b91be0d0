"""The source seam: how the loop receives messages and says which of them are done.

The loop never speaks a transport's bookkeeping itself. It takes messages, applies
them, and tells the source ``done`` once their effects are durable; work that goes on
past its poll batch is ``hold``-ed and ``release``-d. The source turns that into what
its transport settles by (a consumer group's committed offsets, a share group's
acknowledgements). During an outage the loop ``pause``-s the source, keeps it alive
with ``idle``, and ``resume``-s it after.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from confluent_kafka import Message


class Source(Protocol):
    """One way of receiving events (the classic consumer group is the first)."""

    def start(self) -> None:
        """Join and subscribe; ``ready`` says when there is something to read."""

    def take(self, most: int, wait_s: float, linger_s: float) -> list[Message]:
        """The next poll batch: what has arrived (blocks up to ``wait_s`` while nothing has)."""

    def tick(self) -> None:
        """Once per poll: what the source keeps current (retried settlements, lag gauges)."""

    def ours(self, message: Message) -> bool:
        """Whether the message may still be applied here (its partition not taken away)."""

    def done(self, messages: Sequence[Message]) -> None:
        """The messages' effects are durable: they may be settled (past any held one)."""

    def hold(self, message: Message) -> None:
        """The message's work goes on past its batch: settle nothing past it until released."""

    def release(self, message: Message) -> None:
        """The held message's work is done."""

    def settle(self, *, idle: bool) -> None:
        """Hand what is done to the transport (at its pace, or now when ``idle``)."""

    @property
    def paused(self) -> bool:
        """Whether the source is paused on an outage now."""

    def pause(self) -> None:
        """An outage: settle what is done, and take nothing new until ``resume``."""

    def resume(self) -> None:
        """The outage is over."""

    def idle(self, deadline: float) -> None:
        """While paused: stay a member until ``deadline``, losing nothing that arrives."""

    def close(self) -> None:
        """Settle what is done and leave."""
