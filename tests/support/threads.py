"""Running a long-lived service loop in a background thread for the length of a block."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def serving(name: str, run: Callable[[], None], stop: Callable[[], None]) -> Iterator[None]:
    """Start ``run`` in a daemon thread; on exit call ``stop`` and wait for it to return."""
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), f"{name} did not stop"
