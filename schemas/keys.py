"""The Kafka key convention: ``entity_type:entity_id``, UTF-8."""

from __future__ import annotations

SEPARATOR = ":"


def kafka_key(entity_type: str, entity_id: str) -> bytes:
    """The key that sends every event of one entity to one partition."""
    return f"{entity_type}{SEPARATOR}{entity_id}".encode()


def parse_key(key: bytes) -> tuple[str, str]:
    """Split a key into ``(entity_type, entity_id)``; entity types never contain ':'."""
    entity_type, sep, entity_id = key.decode().partition(SEPARATOR)
    if not sep or not entity_type or not entity_id:
        raise ValueError(f"not an inorder key: {key!r}")
    return entity_type, entity_id
