"""Sampling a number through a fault, in a thread: what it was, and whether it ever went back.

A zombie that wakes up and finishes what it froze in the middle of shows as a cursor or
a committed offset that moves backwards for a moment; sampling every few hundred
milliseconds through the whole fault catches it even when the next write corrects it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any


class Watch:
    """Samples ``read`` (a value per key) every ``every`` seconds until stopped."""

    def __init__(self, read: Callable[[], Mapping[Hashable, Any]], every: float = 0.3) -> None:
        self._read = read
        self._every = every
        self._stop = threading.Event()
        self.samples = 0
        self.went_back: list[tuple[Hashable, Any, Any]] = []  # key, before, after
        self._last: dict[Hashable, Any] = {}
        self._thread = threading.Thread(target=self._run, name="watch", daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                now = self._read()
            except Exception:  # noqa: BLE001, S112 - a service the fault made slow: sample again
                continue
            self.samples += 1
            for key, value in now.items():
                before = self._last.get(key)
                if before is not None and value < before:
                    self.went_back.append((key, before, value))
                self._last[key] = value
