"""Snapshots: an entity's whole state at its version, as one event of its own type.

A snapshot carries the state a producer holds for one entity, with the entity's
``(generation, version)`` as its ``(generation, seq)``. It may share that version with
the change event that made it (the outbox allows one of each): projections take it as
any full-state event (an equal version is stale), and a step route only where the
route opts in (``baseline``).
"""

from __future__ import annotations

from schemas.event import Event

SUFFIX = "snapshot"


def snapshot_type(entity_type: str) -> str:
    """The event type of an entity type's snapshots: ``<entity_type>.snapshot``."""
    return f"{entity_type}.{SUFFIX}"


def is_snapshot(event: Event) -> bool:
    """Whether the event is its entity's snapshot."""
    return event.event_type == snapshot_type(event.entity_type)
