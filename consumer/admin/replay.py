"""Replaying dead letters, the pure part: which letters go, from where, to where; or why not.

A letter goes back either as its copy in the dead-letter topic (key, value and the
original's headers, without what dead-lettering added, with the replay count one higher)
or, asked of the relay, as the original row of the outbox. The copy is the default; the
outbox is the only way for a copy that was cut to size, or that was never placed
(letters recorded before copies' places were kept), and it needs the row still there.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas import DecodeError, decode, headers

# A letter whose event was replayed this many times already is not replayed again by
# itself: something keeps refusing it, and another replay would only loop.
MOST_REPLAYS = 3


class Status(enum.StrEnum):
    """Where a dead letter stands (``inorder_dead_letters.status``)."""

    NEW = "new"
    REPLAYING = "replaying"  # taken by a replay not yet finished; the next replay resumes it
    REPLAYED = "replayed"
    DISCARDED = "discarded"


class Decision(enum.StrEnum):
    """What a person decided about a letter (``inorder_dead_letter_decisions.decision``)."""

    REPLAYED = "replayed"
    DISCARDED = "discarded"


class Source(enum.StrEnum):
    """Where a replayed event comes from."""

    COPY = "copy"
    OUTBOX = "outbox"


@dataclass(frozen=True, slots=True)
class Letter:
    """One dead letter, as its row holds it."""

    id: int
    entity_type: str
    entity_id: str
    generation: int
    seq: int
    event_id: str
    reason: str
    topic: str
    letter_topic: str | None
    letter_partition: int | None
    letter_offset: int | None
    cut: bool
    replays: int
    # Where the refused message was read (its copy's headers say the same).
    kafka_partition: int | None = None
    kafka_offset: int | None = None

    @property
    def placed(self) -> tuple[str, int, int] | None:
        """Where the copy is (topic, partition, offset), when known."""
        if self.letter_topic is None or self.letter_partition is None:
            return None
        if self.letter_offset is None:
            return None
        return (self.letter_topic, self.letter_partition, self.letter_offset)


@dataclass(frozen=True, slots=True)
class Chosen:
    """A letter to replay and from where; or, with ``refused``, why it is not replayed."""

    letter: Letter
    source: Source
    refused: str | None = None


def choose(letters: Sequence[Letter], *, from_outbox: bool) -> list[Chosen]:
    """Each letter's replay: from its copy, from the outbox, or refused with the reason."""
    chosen = []
    for letter in letters:
        source = Source.OUTBOX if from_outbox else Source.COPY
        refused = None
        if letter.replays >= MOST_REPLAYS:
            refused = (
                f"replayed {letter.replays} times already and refused again: fix the cause, "
                "or discard it"
            )
        elif source is Source.COPY and letter.cut:
            refused = "its copy was cut to size: replay it with --from-outbox"
        elif source is Source.COPY and letter.placed is None:
            refused = "where its copy is was not recorded: replay it with --from-outbox"
        chosen.append(Chosen(letter, source, refused))
    return chosen


def is_copy_of(
    letter: Letter, pairs: Sequence[tuple[str, Any]] | dict[str, Any], value: bytes | None
) -> bool:
    """Whether a message found at a letter's place is that letter's copy.

    A copy names the place of the message it stands for (``inorder-dlq-topic``,
    ``-partition``, ``-offset``); a letter recorded without one is matched by the event id
    its copy decodes to. Anything else sits there because the topic was recreated or
    written by another client, and is never sent as this letter.
    """
    named = dict(pairs)
    if letter.kafka_partition is not None and letter.kafka_offset is not None:
        place = (letter.topic, str(letter.kafka_partition), str(letter.kafka_offset))
        return tuple(_text(named.get(h)) for h in _PLACE) == place
    try:
        return decode(value).event_id == letter.event_id
    except DecodeError:
        return False


_PLACE = (headers.DLQ_TOPIC, headers.DLQ_PARTITION, headers.DLQ_OFFSET)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def replayed_headers(pairs: Sequence[tuple[str, Any]], replays: int) -> list[tuple[str, Any]]:
    """The copy's headers as the event goes back: dead-lettering's dropped, the count set."""
    kept = [(k, v) for k, v in pairs if not headers.about_a_letter(k) and k != headers.REPLAYS]
    return [*kept, (headers.REPLAYS, str(replays + 1))]
