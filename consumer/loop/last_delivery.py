"""Records on their last delivery that cannot be applied in time: dead-lettered, never archived.

A share group archives a record whose last delivery ends unacknowledged or released.
Before that, its letter goes to the dead-letter topic (which needs Kafka only) and then
its row to PostgreSQL; with PostgreSQL down the letter stays in the topic and one line
says its row is missing. Only a letter Kafka has lets the record be accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog
from confluent_kafka import Message

from consumer import deadletter
from consumer.deadletter import DeadLetter, Placed
from consumer.kinds import Resources
from consumer.settings import ConsumerSettings
from schemas import DecodeError
from schemas.runtime.causes import Cause, cause
from schemas.runtime.logs import first_line
from schemas.runtime.outages import waited_out
from schemas.runtime.reading import Reading

log = structlog.get_logger(__name__)

DETAIL = (
    "its last delivery (the share group's delivery-count limit) could not be applied "
    "before its acquisition lock ran out"
)


def letters_of(messages: Sequence[Message], reading: Reading) -> list[DeadLetter]:
    """A letter per record, with its event when it reads as one."""
    letters = []
    for message in messages:
        event = None
        try:
            event, _ = reading.read(message)
        except DecodeError:
            pass
        except Exception as exc:  # the barrier: what the record holds is its letter's
            if cause(exc) is not Cause.INPUT:
                raise
        letters.append(DeadLetter(message, deadletter.DELIVERY_LIMIT, DETAIL, event))
    return letters


def letter_last(
    resources: Resources[ConsumerSettings], reading: Reading, messages: Sequence[Message]
) -> list[Message]:
    """Dead-letter ``messages``; those whose letters Kafka has (all, or none on an outage)."""
    settings = resources.settings
    letters = letters_of(messages, reading)
    unsent = unrecorded = None
    placed: list[Placed | None] = []
    try:
        placed = deadletter.send(
            resources.producer,
            settings.dead_letter_topic,
            letters,
            settings.dead_letter_max_value_bytes,
        )
    except Exception as exc:
        if not waited_out(exc):
            raise
        unsent = first_line(exc)
    if unsent is not None:
        log.error("last_delivery_not_lettered", records=len(messages), error=unsent)
        return []
    try:
        deadletter.record(resources.conn, letters, placed)
    except Exception as exc:
        if not waited_out(exc):
            raise
        resources.lost("postgres")
        unrecorded = first_line(exc)
    if unrecorded is not None:
        log.error(
            "dead_letter_unrecorded",
            reason=deadletter.DELIVERY_LIMIT,
            letters=[f"{p.topic}:{p.partition}@{p.offset}" for p in placed if p is not None],
            error=unrecorded,
        )
    deadletter.logged(letters)
    return list(messages)
