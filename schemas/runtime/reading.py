"""How one Kafka message becomes an event: inorder's envelope or a CloudEvent on any topic,
and a Debezium outbox event router's message on the topics Debezium writes (the consumer's
poll batch, and the admin commands that read a held copy back).

The envelope a message is read into is what a step route parks, so a parked event is
inorder's envelope whichever form it arrived in. ``DecodeError`` says why a message is
none of them; the poll batch dead-letters it with that reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from schemas import Event, cloudevents, debezium
from schemas.codec import MAX_MESSAGE_BYTES, decode


class Reading:
    """Reads messages into events; Debezium's form only on ``debezium_topics``."""

    def __init__(
        self,
        max_bytes: int = MAX_MESSAGE_BYTES,
        debezium_topics: Iterable[str] = (),
        shape: debezium.Shape | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.debezium_topics = frozenset(debezium_topics)
        self.shape = shape or debezium.Shape()

    @property
    def topics(self) -> list[str]:
        """The topics read only in Debezium's form."""
        return sorted(self.debezium_topics)

    def read(self, message: Message, topic: str | None = None) -> tuple[Event, bytes]:
        """The message's event and its inorder envelope; ``DecodeError`` if it has none.

        ``topic``: the topic the message first came in, when it is read from another (a
        held or dead-letter copy).
        """
        topic = topic if topic is not None else message.topic() or ""
        if topic not in self.debezium_topics:
            return cloudevents.decode_message(
                message.value(), message.headers(), max_bytes=self.max_bytes
            )
        kind, at = message.timestamp()
        envelope = debezium.envelope(
            self.shape,
            topic,
            message.key(),
            message.headers(),
            message.value(),
            None if kind == TIMESTAMP_NOT_AVAILABLE else at,
            max_bytes=self.max_bytes,
        )
        return decode(envelope, max_bytes=self.max_bytes), envelope
