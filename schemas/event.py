"""The event value every part of inorder passes around."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas.keys import kafka_key


@dataclass(frozen=True, slots=True)
class Event:
    """One decoded event envelope. Ordered per entity by ``(generation, seq)`` only."""

    event_id: str
    event_type: str
    entity_type: str
    entity_id: str
    generation: int
    seq: int
    occurred_at: str
    published_at: str
    payload: Mapping[str, Any]

    @property
    def version(self) -> tuple[int, int]:
        """The ordering key within the entity: generation first, then seq."""
        return (self.generation, self.seq)

    @property
    def key(self) -> bytes:
        """The Kafka message key, ``entity_type:entity_id``."""
        return kafka_key(self.entity_type, self.entity_id)


def default_event_id(entity_type: str, entity_id: str, generation: int, seq: int) -> str:
    """A deterministic event id, so a retried write cannot mint a second identity."""
    return f"{entity_type}:{entity_id}:{generation}:{seq}"
