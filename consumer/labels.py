"""Label values that come from producers, bounded: a metric keeps a series per value.

Event types are written by producers (any dotted lower-case name up to 128 characters).
Each value a counter is labelled with becomes a series in this process, in every
Prometheus that scrapes it and in every rule that reads it: a producer that writes a new
event type per event would make them grow without end. The first ``MOST_EVENT_TYPES``
values a process meets keep their own series; any other is counted under ``OTHER``.
"""

from __future__ import annotations

import threading
from typing import Final

MOST_EVENT_TYPES: Final = 200
OTHER: Final = "other"

_lock = threading.Lock()
_seen: set[str] = set()


def event_type(value: str) -> str:
    """``value`` as an event type label: itself while there is room, else ``OTHER``."""
    if value in _seen:
        return value
    with _lock:
        if value in _seen or len(_seen) < MOST_EVENT_TYPES:
            _seen.add(value)
            return value
    return OTHER


def forget_all() -> None:
    """Start counting distinct values again (tests)."""
    with _lock:
        _seen.clear()
