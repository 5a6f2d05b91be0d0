"""What a process's main loop reports to its HTTP endpoints: alive, and ready or why not.

``/healthz`` answers 200 while the main loop keeps beating, ``/readyz`` 200 while
the process says it can do its work (dependencies reachable); the server is
``schemas.runtime.endpoints``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from schemas.runtime import kafka_watch


class Health:
    """What the main loop reports: a heartbeat, and whether it is ready (and if not, why)."""

    def __init__(self, stale_after_s: float = 60.0) -> None:
        self._stale_after_s = stale_after_s
        self._beat = time.monotonic()
        self._not_ready: dict[str, str] = {"starting": "not started yet"}
        self._notes: dict[str, str] = {}
        self._lock = threading.Lock()

    def beat(self) -> None:
        """The main loop is alive."""
        self._beat = time.monotonic()

    def blocked(self, dependency: str, why: str) -> None:
        """Mark not ready because ``dependency`` is unusable."""
        with self._lock:
            self._not_ready[dependency] = why

    def cleared(self, dependency: str) -> None:
        """``dependency`` works again."""
        with self._lock:
            self._not_ready.pop(dependency, None)

    def note(self, topic: str, text: str) -> None:
        """What ``/readyz`` says beside ready or not (how the process consumes, what it holds)."""
        with self._lock:
            self._notes[topic] = text

    @property
    def notes(self) -> dict[str, str]:
        """The notes ``/readyz`` shows after its verdict."""
        with self._lock:
            return dict(self._notes)

    def sleep(self, seconds: float, stopping: Callable[[], bool], tick_s: float = 0.2) -> None:
        """Wait ``seconds`` while beating; return early once ``stopping()`` is true."""

        def nap(deadline: float) -> None:
            time.sleep(min(tick_s, max(0.0, deadline - time.monotonic())))

        self.wait(seconds, stopping, nap)

    def wait(
        self, seconds: float, stopping: Callable[[], bool], step: Callable[[float], None]
    ) -> None:
        """Call ``step(deadline)`` while beating, until ``seconds`` passed or ``stopping()``."""
        deadline = time.monotonic() + seconds
        while not stopping() and time.monotonic() < deadline:
            self.beat()
            step(deadline)

    @property
    def live(self) -> bool:
        """True while the main loop beat recently."""
        return time.monotonic() - self._beat < self._stale_after_s

    @property
    def problems(self) -> dict[str, str]:
        """Why the process is not ready; empty when it is. Kafka's refusals of the process's
        credentials, which no call raises, count too (``kafka_watch``)."""
        with self._lock:
            found = dict(self._not_ready)
        return {**kafka_watch.problems(), **found}
