"""Dead letters' copies, read back from the dead-letter topic at the places recorded for them."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, Message, TopicPartition

from consumer.admin.replay import Letter, is_copy_of
from consumer.kinds._resources import Resources
from schemas.runtime import kafka_clients

if TYPE_CHECKING:
    from consumer.settings import SweeperSettings

# How long a replay reads the dead-letter topic for the copies it needs.
COPY_READ_S = 30.0


def read(
    tools: Resources[SweeperSettings], letters: Sequence[Letter]
) -> tuple[dict[int, Message], set[int]]:
    """Each letter's copy (by letter id), read from the dead-letter topic where it was placed;
    and the letters whose place holds another message (``is_copy_of``)."""
    wanted: dict[tuple[str, int], dict[int, Letter]] = defaultdict(dict)
    for letter in letters:
        assert letter.placed is not None  # ``choose`` refused the rest
        topic, partition, offset = letter.placed
        wanted[(topic, partition)][offset] = letter
    if not wanted:
        return {}, set()
    reader = kafka_clients.consumer(
        tools.settings, "inorder-admin", f"inorder-admin-{uuid.uuid4().hex[:8]}"
    )
    found: dict[int, Message] = {}
    try:
        reader.assign([TopicPartition(t, p, min(offsets)) for (t, p), offsets in wanted.items()])
        _read(reader, wanted, found)
    finally:
        reader.close()
    by_id = {letter.id: letter for letter in letters}
    strangers = {
        letter_id
        for letter_id, message in found.items()
        if not is_copy_of(by_id[letter_id], message.headers() or [], message.value())
    }
    return {k: v for k, v in found.items() if k not in strangers}, strangers


def _read(
    reader: Consumer, wanted: dict[tuple[str, int], dict[int, Letter]], found: dict[int, Message]
) -> None:
    """Read each partition from its first wanted offset to its last, keeping the copies."""
    deadline = time.monotonic() + COPY_READ_S
    left = {key: max(offsets) for key, offsets in wanted.items()}
    while left and time.monotonic() < deadline:
        for message in reader.consume(500, 0.5):
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if message.error() is not None or topic is None or partition is None:
                continue
            key = (topic, partition)
            letter = None if offset is None else wanted.get(key, {}).get(offset)
            if letter is not None:
                found[letter.id] = message
            if key in left and offset is not None and offset >= left[key]:
                del left[key]
