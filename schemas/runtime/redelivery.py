"""Reading a protocol topic one message at a time, each refused alone, none lost.

The relay (republish requests) and the sweeper (republish results) take a few messages
at once and commit each after acting on it. What one message holds refuses that message:
it is handed to the caller to count and log, and committed. When acting or committing
fails otherwise (an outage, a rebalance under way), the messages not yet done are in
hand but past the consumer's position: without a rewind, the next fetch would start
after them and the next commit would pass them, unread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import suppress

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from schemas.errors import DecodeError
from schemas.runtime.causes import Cause, cause
from schemas.runtime.logs import first_line

# What a refused message is handed to: the message, a reason code and what exactly.
Refuse = Callable[[Message, str, str], None]


def handle_each(
    consumer: Consumer,
    messages: Sequence[Message],
    act: Callable[[Message], None],
    refuse: Refuse,
    unusable: str,
) -> None:
    """Act on each message in turn and commit it; what one message raised refuses it.

    A ``DecodeError`` goes to ``refuse`` with its own reason, any other error the cause
    table gives to the input with the reason ``unusable``; the message is committed all
    the same. Anything else rewinds the messages not yet done and is raised.
    """
    for done, message in enumerate(messages):
        try:
            try:
                act(message)
            except DecodeError as exc:
                refuse(message, exc.reason, exc.detail)
            except Exception as exc:  # the barrier: what one message raised refuses it
                if cause(exc) is not Cause.INPUT:
                    raise
                refuse(message, unusable, f"{type(exc).__name__}: {first_line(exc)}")
            consumer.commit(message=message, asynchronous=False)
        except BaseException:
            rewind(consumer, messages[done:])  # read again once the outage passes
            raise


def rewind(consumer: Consumer, undone: Sequence[Message]) -> None:
    """Move each partition back to its first message in ``undone``, to be read again."""
    first: dict[tuple[str, int], int] = {}
    for message in undone:
        key = (message.topic() or "", message.partition() or 0)
        offset = message.offset() or 0
        first[key] = min(first.get(key, offset), offset)
    for (topic, partition), offset in first.items():
        # A partition revoked meanwhile is its new owner's to read from the committed offset.
        with suppress(KafkaException):
            consumer.seek(TopicPartition(topic, partition, offset))
